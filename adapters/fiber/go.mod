module github.com/idemgo/idem/adapters/fiber

go 1.26.8
