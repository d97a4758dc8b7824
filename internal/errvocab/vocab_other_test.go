//go:build !linux

package errvocab

var closedErrorsOS = map[string]error{}
