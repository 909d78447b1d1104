module github.com/idemgo/idem/stores/gorm

go 1.26.8
