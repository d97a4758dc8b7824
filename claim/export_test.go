package claim

// SetChangeSeq sets the Seq of c's last change, for the tests of the
// numbering at its wrap.
func SetChangeSeq(c *Controller, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq = seq
}

// WithClockTimeout is withClockTimeout, for its tests.
var WithClockTimeout = withClockTimeout
