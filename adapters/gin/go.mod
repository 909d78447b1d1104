module github.com/idemgo/idem/adapters/gin

go 1.26.8
