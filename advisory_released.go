package lockhooks

// LoseIfReleased marks the AdvisoryLock living on c lost if c's tracking,
// just brought up to date after the statement text on c ("": a statement
// of the transaction that just ended, read once it ended), no longer holds
// the lock's key: the statement released it (advisorylock.Lock.Released).
// The caller settles c afterwards.
func (c *conn) LoseIfReleased(text string) {
	l := c.advisory.Load()
	if l == nil {
		return
	}
	loss, lostCh, ok := l.lock.Released(text)
	if !ok {
		return
	}
	c.ReportLoss(loss)
	l.freeTurn()  // another acquirer of this process may take the key at once
	close(lostCh) // after the log, the count and the turn, so whoever waits on Lost sees them
}
