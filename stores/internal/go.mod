module github.com/idemgo/idem/stores/internal

go 1.26
