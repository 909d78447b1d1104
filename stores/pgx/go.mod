module github.com/idemgo/idem/stores/pgx

go 1.26.8
