module github.com/idemgo/idem/adapters/nethttp

go 1.26

require github.com/idemgo/idem/core v0.1.0

replace github.com/idemgo/idem/core => ../../core
