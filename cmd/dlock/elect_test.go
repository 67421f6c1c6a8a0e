package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// termsIn returns the terms of the "term=N" lines of the file at path.
func termsIn(t *testing.T, path string) []uint64 {
	t.Helper()
	b, _ := os.ReadFile(path)
	var terms []uint64
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "term="); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("bad line %q in %s", line, path)
			}
			terms = append(terms, n)
		}
	}
	return terms
}

// awaitTerms waits until the file at path has n term lines.
func awaitTerms(t *testing.T, path string, n int, limit time.Duration) []uint64 {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if terms := termsIn(t, path); len(terms) >= n {
			return terms
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has terms %v after %v, want %d", path, termsIn(t, path), limit, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestElect_RunsWhileLeaderWithRunsExitCodes(t *testing.T) { eachStore(t, testElectExitCodes) }

func testElectExitCodes(t *testing.T, store string) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	t.Run("the command's own code and the environment", func(t *testing.T) {
		res := dlock(t, store, "elect", "-o", "json", "--value", "node-a", "elect:env", "--", "sh", "-c",
			`echo "$DLOCK_ELECTION|$DLOCK_KEY|$DLOCK_TERM|$DLOCK_FENCE|$DLOCK_VALUE"; exit 3`)
		wantCode(t, res, 3)
		parts := strings.Split(strings.TrimSpace(res.stdout), "|")
		if len(parts) != 5 || parts[0] != "elect:env" || parts[1] != "elect:env" || parts[2] != parts[3] || parts[4] != "node-a" {
			t.Fatalf("environment %q", res.stdout)
		}
		term, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil || term == 0 {
			t.Fatalf("DLOCK_TERM %q", parts[2])
		}
		var rep struct {
			Name     string
			Result   string
			Term     uint64
			ExitCode int `json:"exit_code"`
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(res.stderr)), &rep); err != nil {
			t.Fatalf("-o json stderr %q: %v", res.stderr, err)
		}
		if rep.Name != "elect:env" || rep.Result != "ran" || rep.Term != term || rep.ExitCode != 3 {
			t.Fatalf("json report %+v", rep)
		}
		// It resigned: the next campaigner leads at once.
		wantCode(t, dlock(t, store, "elect", "--wait-timeout", "2s", "elect:env", "--", "true"), 0)
	})
	t.Run("usage errors are 64 and run nothing", func(t *testing.T) {
		for _, args := range [][]string{
			{"elect", "elect:u"},
			{"elect", "elect:u", "touch", marker},
			{"elect", "--ttl", "1ms", "elect:u", "--", "touch", marker},
			{"elect", "--value", "a\nb", "elect:u", "--", "touch", marker},
			{"elect", "", "--", "touch", marker},
		} {
			wantCode(t, dlock(t, store, args...), 64)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("a command ran after a usage error")
		}
	})
	t.Run("not leader within --wait-timeout is 75; a forwarded SIGTERM ends the leader's command", func(t *testing.T) {
		leader := command(store, "elect", "--value", "first", "elect:held", "--", "sh", "-c", "echo term=$DLOCK_TERM; exec sleep 30")
		var out bytes.Buffer
		leader.Stdout = &out
		if err := leader.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = leader.Process.Kill(); _ = leader.Wait() }()
		waitHeld(t, store, "elect:held")
		res := dlock(t, store, "elect", "--wait-timeout", "300ms", "elect:held", "--", "touch", marker)
		wantCode(t, res, 75)
		if !strings.Contains(res.stderr, "first") {
			t.Errorf("the 75 message does not name the leader: %q", res.stderr)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the command ran while another process led")
		}
		// A campaign ended by SIGTERM exits 128+15.
		waiter := command(store, "elect", "--debug", "elect:held", "--", "touch", marker)
		logPath := filepath.Join(dir, "waiter.log")
		logFile, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		defer logFile.Close()
		waiter.Stderr = logFile
		if err := waiter.Start(); err != nil {
			t.Fatal(err)
		}
		// Campaigning (so its signal handling is set up) before the signal.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(logPath); strings.Contains(string(b), "campaigning in") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the waiter never said it was campaigning")
			}
		}
		time.Sleep(50 * time.Millisecond)
		_ = waiter.Process.Signal(syscall.SIGTERM)
		var ee *exec.ExitError
		if err := waiter.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Fatalf("campaign ended by SIGTERM: %v, want exit 143", err)
		}
		// The leader's command gets the SIGTERM; dlock exits with its status.
		_ = leader.Process.Signal(syscall.SIGTERM)
		if err := leader.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Fatalf("leader after SIGTERM: %v, want the command's 143", err)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the interrupted campaigner ran its command")
		}
		// Resigned: free at once.
		wantCode(t, dlock(t, store, "elect", "--wait-timeout", "2s", "elect:held", "--", "true"), 0)
	})
}

// TestElect_LostLeadershipAndKeepCampaigning: a leader stopped (SIGSTOP)
// past its TTL has its command terminated by the supervisor at its
// deadline; another campaigner leads meanwhile with a greater term. On
// SIGCONT, without --keep-campaigning dlock elect exits 70; with it, it
// campaigns again and runs the command again in a new, greater term.
func TestElect_LostLeadershipAndKeepCampaigning(t *testing.T) {
	store := stores[0].start(t) // dlockd
	for _, keep := range []bool{false, true} {
		name := "exit-70"
		if keep {
			name = "keep-campaigning"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			terms := filepath.Join(dir, "terms")
			election := "elect:lost:" + name
			args := []string{"elect", "--ttl", "500ms", "--grace", "2s", election, "--", "sh", "-c", `echo term=$DLOCK_TERM >> ` + terms + `; exec sleep 60`}
			if keep {
				args = append(args[:1], append([]string{"--keep-campaigning"}, args[1:]...)...)
			}
			first := command(store, args...)
			var errb bytes.Buffer
			first.Stderr = &errb
			if err := first.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = first.Process.Kill(); _ = first.Wait() }()
			t1 := awaitTerms(t, terms, 1, 10*time.Second)[0]

			if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			second := dlock(t, store, "elect", "--wait-timeout", "10s", election, "--", "sh", "-c", `echo term=$DLOCK_TERM >> `+terms)
			wantCode(t, second, 0)
			if err := first.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			got := termsIn(t, terms)
			if len(got) != 2 || got[1] <= t1 {
				t.Fatalf("terms %v: want the second leader's term greater than %d", got, t1)
			}
			if !keep {
				var ee *exec.ExitError
				if err := first.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 70 {
					t.Fatalf("first dlock elect: %v, want exit 70\nstderr: %s", err, errb.String())
				}
				return
			}
			// It campaigns again, leads (the second resigned) and runs the
			// command in a third, greater term.
			got = awaitTerms(t, terms, 3, 10*time.Second)
			if got[2] <= got[1] {
				t.Fatalf("terms %v: the third term is not the greatest", got)
			}
			_ = first.Process.Signal(syscall.SIGTERM)
			var ee *exec.ExitError
			if err := first.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 143 {
				t.Fatalf("leader after SIGTERM: %v, want the command's 143\nstderr: %s", err, errb.String())
			}
			if !strings.Contains(errb.String(), "campaigning again") {
				t.Errorf("stderr does not say it campaigns again: %q", errb.String())
			}
		})
	}
}
