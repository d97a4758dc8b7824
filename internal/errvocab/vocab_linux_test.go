package errvocab

import "github.com/vipkit/vipkit/transport/netns"

var closedErrorsOS = map[string]error{"netns.ErrClosed": netns.ErrClosed}
