// Package verify measures what a lock store guarantees under faults: it
// runs clients that acquire, renew, work and release against a store while
// a fault schedule (the nemesis) disturbs it, records every operation with
// the time its request left and the time its answer came back on one
// monotonic clock, and checks the history.
//
// # What a run does
//
// Run opens Config.Clients Lockers on the store (one per client, as
// separate processes would), each through a RecordingDriver (every store
// call recorded as a historytest.Op) over a dlocktest.FaultDriver (the
// client-side faults: a frozen process, blocked heartbeats). Each client
// loops: Acquire a random key of Config.Keys, then, while its lease is
// valid by its own clock with at least a write's budget left, write the
// lease's fence to a fenced register (Register: package fence/fencesql on
// an embedded SQLite file, a store of its own that no fault touches), then
// Release. The run lasts Config.Duration: a quiet first fifth, the faults
// injected for the middle three fifths, then healed, and a last fifth to
// recover. Every fault is healed before Run returns, whatever happens.
//
// # The checkers
//
//   - Mutual exclusion (Findings.DoubleGrants): two holds of one key whose
//     holders acted at the same time: the second grant was received before
//     the first holder's last write was sent. A process pause or a clock
//     jump on a client causes these on every lease-based store (the
//     paused holder wakes and writes); Findings.EarlyGrants counts the
//     ones the store itself caused: a grant made while a correct client
//     could still believe the earlier grant valid (historytest.Check's
//     early grant, exact over every pair).
//   - Fences (Findings.FenceViolations): successive grants of a key must
//     get strictly greater fences, and no fence may go to two owners.
//   - The fenced register (Findings.StaleWritesAccepted): a write accepted
//     after the register had accepted a write of another grant with an
//     equal or greater fence. It must be 0 whenever fences are sound; the
//     writes the register refused (fencing at work) are counted apart.
//   - Liveness: acquisitions that failed while the fault was on, the
//     longest time without any grant, and the time from the heal to the
//     next grant.
//   - Linearizability (Findings.Linearizable): the history of each key is
//     checked with porcupine (github.com/anishathalye/porcupine, the
//     checker of Knossos's family) against a lock-with-fence model whose
//     holder's validity ends as the client computes it; a violation is
//     written as porcupine's HTML visualisation.
//
// # Faults
//
// Faults (the names of Config.Faults, see Faults) act on the client
// (pause, clock-jump), on the client↔store links through TCP proxies the
// verifier owns (blackhole, reply-loss) or on the store's processes
// (kill, restart-lossy, failover, partition, leader-isolate, leader-kill,
// leader-pause) or on the store's own clock (store-clock-jump: dlockd's
// leader, through its test clock offset), which needs a Target that can do
// it: package verify/matrix starts such stores.
package verify
