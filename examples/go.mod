module github.com/idemgo/idem/examples

go 1.26.8
