// Package installcheck holds no code: its test runs `make install` into a
// staging directory (DESTDIR) and verifies the installed systemd units
// against the installed binaries with `systemd-analyze verify --root`, as
// a user's `sudo make install` would leave them.
package installcheck
