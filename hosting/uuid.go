package hosting

// ValidUUID reports whether id is a canonical lowercase UUID
// (8-4-4-4-12 hex digits), the only form a share id takes; anything else
// cannot name a share. The API refuses other ids and the stores never look
// them up.
func ValidUUID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}
