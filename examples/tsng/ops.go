package tsng

// opsCommands are the commands for operating the agent.
func opsCommands() []*command { return nil }
