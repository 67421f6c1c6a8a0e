package cli

// dlock run --resume-file F and --max-hold D: the hooks that run.go calls.
// --resume-file keeps a re-executed job's lease: the lease's token is saved
// to F (mode 0600) after the grant, resumed on the next start while the
// store still holds it (dlock.Locker.Resume: same fence), and F is removed
// when run ends (the lease released or lost). --max-hold bounds the hold
// (dlock.WithMaxHold).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/dlock-dev/dlock"
)

// resumeFlags are run's --resume-file and --max-hold.
type resumeFlags struct {
	file    string        // --resume-file; "" = off
	maxHold time.Duration // --max-hold; 0 = no bound

	resumed bool             // the lease was resumed from file
	saved   dlock.LeaseToken // the token this run wrote (or resumed) in file
	own     bool             // file holds saved: remove it at the end
	lock    *os.File         // file+".lock", flocked while this run lives
}

// resumeState is the content of a resume file.
type resumeState struct {
	// Token is the lease's token.
	Token dlock.LeaseToken `json:"token"`
	// Granted is when the lease was first granted, by this machine's wall
	// clock (the file never leaves the machine), for --max-hold across
	// re-executions.
	Granted time.Time `json:"granted"`
}

func (r *resumeFlags) addFlags(fl *pflag.FlagSet) {
	fl.StringVar(&r.file, "resume-file", "", "keep the lease across a re-execution: save its token to this file (mode 0600) once granted, resume it on the next start while the store still holds it (same fence), remove the file when run ends; a file whose lease is gone is reported and replaced by a fresh acquisition")
	fl.DurationVar(&r.maxHold, "max-hold", 0, "stop renewing the lease this long after its grant (counted from the first grant across --resume-file re-executions); the command is then terminated as on a lost lease, exit 70 (0: no bound)")
}

// validate checks the flags before any store is called (exit 64).
func (r *resumeFlags) validate(f *runFlags) error {
	switch {
	case r.maxHold < 0:
		return fmt.Errorf("--max-hold must not be negative, not %v", r.maxHold)
	case r.file == "":
		return nil
	case f.permits > 0:
		return fmt.Errorf("--resume-file and --permits cannot be combined (a permit is taken afresh on each start)")
	case f.once.on():
		return fmt.Errorf("--resume-file and --once-per cannot be combined (the run ledger records each start)")
	}
	if fi, err := os.Stat(filepath.Dir(r.file)); err != nil || !fi.IsDir() {
		return fmt.Errorf("--resume-file %q: its directory does not exist", r.file)
	}
	return nil
}

// options are the lease options of --max-hold.
func (r *resumeFlags) options() []dlock.Option {
	if r.maxHold > 0 {
		return []dlock.Option{dlock.WithMaxHold(r.maxHold)}
	}
	return nil
}

// acquire resumes the lease saved in --resume-file when the store still
// holds it, and otherwise calls fresh (run's own acquisition) and saves the
// new lease's token. Without --resume-file it is fresh.
func (r *resumeFlags) acquire(ctx context.Context, g *globals, l *dlock.Locker, f *runFlags, key string, opts []dlock.Option,
	fresh func() (*dlock.Lease, int, error)) (*dlock.Lease, int, error) {
	if r.file == "" {
		return fresh()
	}
	warnf := func(format string, args ...any) {
		fmt.Fprintf(g.stderr, "dlock: --resume-file %s: "+format+"\n", append([]any{r.file}, args...)...)
	}
	// Only one live run may use the file: a second run started while the
	// first still runs (a cron job that overlaps itself) must not resume
	// the first one's lease, which would run both under one grant. The
	// kernel drops the flock when its process dies, SIGKILL included.
	if busy, err := r.claim(); err != nil {
		return nil, -1, err
	} else if busy {
		warnf("another dlock run that is still alive uses this file: not resuming its lease; acquiring afresh")
		return fresh()
	}
	st, ok, err := r.load(key)
	switch {
	case err != nil && errors.Is(err, dlock.ErrInvalidArgument):
		return nil, -1, err
	case err != nil:
		warnf("%v; not trusted: acquiring afresh", err)
	case ok:
		ls, err := r.resume(ctx, g, l, f, st, opts, warnf)
		if ls != nil || err != nil {
			return ls, -1, err
		}
	}
	before := time.Now() // no later than the grant: --max-hold errs on the early side
	ls, permit, err := fresh()
	if err == nil && ls != nil && !ls.Degraded() {
		if err := r.save(resumeState{Token: ls.Token(), Granted: before}); err != nil {
			warnf("cannot save the lease's token (%v); a re-execution will acquire afresh", err)
		}
	}
	return ls, permit, err
}

// resume tries the saved lease. It returns the resumed lease; or nil and
// nil to acquire afresh (the lease is gone, the store cannot resume, or the
// saved lease reached --max-hold, each said on stderr); or an error that
// ends run (the store could not be reached, ctx ended).
func (r *resumeFlags) resume(ctx context.Context, g *globals, l *dlock.Locker, f *runFlags, st resumeState, opts []dlock.Option,
	warnf func(string, ...any)) (*dlock.Lease, error) {
	tok := st.Token
	ropts := append([]dlock.Option(nil), opts...)
	overdue := false
	now := time.Now()
	// A grant in the future (this machine's clock was stepped back, or
	// the file was edited) counts as now: never more than --max-hold.
	future := st.Granted.After(now)
	if r.maxHold > 0 && !st.Granted.IsZero() {
		left := holdLeft(r.maxHold, st.Granted, now)
		if left <= 0 {
			overdue = true
		} else {
			ropts = append(ropts, dlock.WithMaxHold(left))
		}
	}
	// The store may be restarting: retry an unreachable one for
	// --retry-for, as a fresh acquisition would.
	budget := time.Now().Add(f.retryFor)
	var ls *dlock.Lease
	var err error
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		ls, err = l.Resume(ctx, tok, ropts...)
		if err == nil || !errors.Is(err, dlock.ErrUnavailable) || ctx.Err() != nil || time.Now().Add(pause).After(budget) {
			break
		}
		if !sleepCtx(ctx, pause) {
			break
		}
	}
	switch {
	case err == nil && overdue:
		warnf("the saved lease on %q (fence %d) was granted %v ago, past --max-hold %v: releasing it and acquiring afresh",
			tok.Key, tok.Fence, time.Since(st.Granted).Round(time.Second), r.maxHold)
		_ = releaseLease(ls)
		r.remove(tok)
		return nil, nil
	case err == nil:
		r.resumed, r.saved, r.own = true, tok, true
		if future {
			// Count from now in later re-executions too, or each would
			// get a whole --max-hold again.
			warnf("the saved lease on %q was granted at %s, in the future by this machine's clock: counting its hold from now",
				tok.Key, st.Granted.Format(time.RFC3339))
			if err := r.save(resumeState{Token: tok, Granted: now}); err != nil {
				warnf("cannot save the lease's grant time (%v)", err)
			}
		}
		if g.debug {
			fmt.Fprintf(g.stderr, "dlock: debug: resumed the lease on %q saved in %s (fence %d)\n", tok.Key, r.file, tok.Fence)
		}
		return ls, nil
	case errors.Is(err, dlock.ErrLeaseLost):
		warnf("the saved lease on %q (fence %d) is no longer held (%s): acquiring afresh", tok.Key, tok.Fence, plainCause(err))
		r.remove(tok)
		return nil, nil
	case errors.Is(err, dlock.ErrUnsupported):
		warnf("the store at %s cannot resume a lease (its grants end with the process that made them): acquiring afresh", g.storeAddr())
		r.remove(tok)
		return nil, nil
	case errors.Is(err, dlock.ErrInvalidArgument) && !errors.Is(err, dlock.ErrPermissionDenied):
		warnf("the saved token was refused (%v): acquiring afresh", err)
		r.remove(tok)
		return nil, nil
	}
	return nil, err
}

// holdLeft returns what is left of --max-hold maxHold at now for a lease
// first granted at granted (this machine's wall clock, from the resume
// file), within [0, maxHold]: a grant after now counts as now.
func holdLeft(maxHold time.Duration, granted, now time.Time) time.Duration {
	held := max(now.Sub(granted), 0)
	return min(max(maxHold-held, 0), maxHold)
}

// load reads the resume file. ok is false when there is none. An error
// matching ErrInvalidArgument ends run (the file cannot be read at all);
// another says why the file is not trusted (acquire afresh and replace
// it).
func (r *resumeFlags) load(key string) (resumeState, bool, error) {
	fh, err := os.OpenFile(r.file, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return resumeState{}, false, nil
	case errors.Is(err, syscall.ELOOP):
		return resumeState{}, false, fmt.Errorf("it is a symbolic link")
	case err != nil:
		return resumeState{}, false, fmt.Errorf("%w: --resume-file %q: %v", dlock.ErrInvalidArgument, r.file, err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return resumeState{}, false, fmt.Errorf("%w: --resume-file %q: %v", dlock.ErrInvalidArgument, r.file, err)
	}
	if !fi.Mode().IsRegular() {
		return resumeState{}, false, fmt.Errorf("%w: --resume-file %q is not a regular file", dlock.ErrInvalidArgument, r.file)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return resumeState{}, false, fmt.Errorf("its mode is %#o, readable or writable by others (dlock writes 0600)", perm)
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return resumeState{}, false, fmt.Errorf("it belongs to uid %d, not to this user", sys.Uid)
	}
	b, err := io.ReadAll(io.LimitReader(fh, 64<<10))
	if err != nil {
		return resumeState{}, false, fmt.Errorf("%w: --resume-file %q: %v", dlock.ErrInvalidArgument, r.file, err)
	}
	var st resumeState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return resumeState{}, false, fmt.Errorf("malformed (%v)", err)
	}
	if err := st.Token.Check(); err != nil {
		return resumeState{}, false, fmt.Errorf("malformed (%v)", err)
	}
	if st.Token.Key != key {
		return resumeState{}, false, fmt.Errorf("it holds a lease on %q, not on %q", st.Token.Key, key)
	}
	return st, true, nil
}

// save writes st to the resume file atomically, mode 0600.
func (r *resumeFlags) save(st resumeState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(r.file), "."+filepath.Base(r.file)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), r.file); err != nil {
		return err
	}
	r.saved, r.own = st.Token, true
	return nil
}

// remove deletes the resume file if it still holds tok.
func (r *resumeFlags) remove(tok dlock.LeaseToken) {
	b, err := os.ReadFile(r.file)
	if err != nil {
		return
	}
	var st resumeState
	if json.Unmarshal(b, &st) == nil && st.Token != tok {
		return // replaced meanwhile by another run
	}
	_ = os.Remove(r.file)
}

// done removes the file this run saved or resumed: run ends, its lease is
// released or lost, and a later start must acquire afresh. (A run killed
// with SIGKILL never gets here: the file stays for its re-execution.) The
// lock file stays, empty: removing it could let two later runs lock two
// different files of the same name.
func (r *resumeFlags) done() {
	if r.file != "" && r.own {
		r.remove(r.saved)
	}
	if r.lock != nil {
		_ = r.lock.Close() // drops the flock
		r.lock = nil
	}
}

// claim takes the exclusive flock of file+".lock" (created 0600) for the
// life of this run. busy reports that another live process holds it.
func (r *resumeFlags) claim() (busy bool, err error) {
	path := r.file + ".lock"
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, fmt.Errorf("%w: --resume-file %q: its lock file: %v", dlock.ErrInvalidArgument, r.file, err)
	}
	if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fh.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return true, nil
		}
		return false, fmt.Errorf("%w: --resume-file %q: lock %s: %v", dlock.ErrInvalidArgument, r.file, path, err)
	}
	r.lock = fh
	return false, nil
}

// lostMessage is what run says when the lease ended while the command ran.
func (r *resumeFlags) lostMessage(key string, err error, grace time.Duration) string {
	if errors.Is(err, dlock.ErrMaxHoldReached) {
		return fmt.Sprintf("dlock: lease on %q reached --max-hold %v while the command ran; sending SIGTERM to everything it started (SIGKILL after %v)\n", key, r.maxHold, grace)
	}
	return fmt.Sprintf("dlock: lease on %q lost while the command ran; sending SIGTERM to everything it started (SIGKILL after %v)\n", key, grace)
}

// sleepCtx sleeps for d, or returns false when ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
