package crdt

// Test hooks for the external test package (crdt_test), which runs the
// storetest suite on MemStore. They are compiled into tests only.
var (
	CorruptMemForTest    = corruptMem
	SetMemVersionForTest = setMemVersion
)
