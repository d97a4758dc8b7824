module github.com/vipkit/vipkit

go 1.26
