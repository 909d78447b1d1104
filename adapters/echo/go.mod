module github.com/idemgo/idem/adapters/echo

go 1.26.8
