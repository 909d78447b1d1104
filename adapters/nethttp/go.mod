module github.com/idemgo/idem/adapters/nethttp

go 1.26.8
