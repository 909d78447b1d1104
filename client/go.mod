module github.com/idemgo/idem/client

go 1.26
