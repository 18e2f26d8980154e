package repository

// NewDurabilityUnchecked holds level without ParseSyncCommit's check, for
// a test that the level reaches the server.
func NewDurabilityUnchecked(level string) *Durability { return &Durability{configured: level} }
