package server

import "errors"

// ErrConfig is matched (errors.Is) by Start's errors that come from the
// configuration, not from the moment: an auth file, a certificate, a key
// or a CA file that is missing, unreadable or does not parse, and an audit
// log path that cannot be written. Starting again without changing the
// configuration fails the same way, so cmd/dlockd exits 2 for it (a
// service manager then stops restarting it: the systemd unit's
// RestartPreventExitStatus=2). A data directory locked by another process
// is not one of them.
var ErrConfig = errors.New("dlockd: configuration")

// configError is an error of the configuration: its message is err's, and
// it matches both ErrConfig and err.
type configError struct{ err error }

func (e configError) Error() string   { return e.err.Error() }
func (e configError) Unwrap() []error { return []error{ErrConfig, e.err} }

// configErr marks err (nil: nil) as a configuration error (ErrConfig).
func configErr(err error) error {
	if err == nil || errors.Is(err, ErrConfig) {
		return err
	}
	return configError{err}
}
