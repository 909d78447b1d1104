module github.com/idemgo/idem/bench

go 1.26.0

require (
	github.com/glebarez/sqlite v1.11.0
	github.com/go-sql-driver/mysql v1.8.1
	github.com/gofiber/fiber/v2 v2.52.15
	github.com/idemgo/idem/adapters/fiber v0.1.0
	github.com/idemgo/idem/adapters/nethttp v0.1.0
	github.com/idemgo/idem/core v0.1.0
	github.com/idemgo/idem/stores/gorm v0.1.0
	github.com/idemgo/idem/stores/pgx v0.1.0
	github.com/idemgo/idem/stores/redis v0.1.0
	github.com/idemgo/idem/stores/sql v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/valyala/fasthttp v1.51.0
	gorm.io/driver/mysql v1.6.0
	gorm.io/driver/postgres v1.6.3
	gorm.io/gorm v1.31.2
)

require github.com/ncruces/go-strftime v1.0.0 // indirect

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/andybalholm/brotli v1.1.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/glebarez/go-sqlite v1.21.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/idemgo/idem/stores/internal v0.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-colorable v0.1.13 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/mattn/go-runewidth v0.0.16 // indirect
	github.com/philhofer/fwd v1.1.3-0.20240916144458-20a13a1f6b7c // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/rivo/uniseg v0.2.0 // indirect
	github.com/tinylib/msgp v1.2.5 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/tcplisten v1.0.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	gorm.io/plugin/dbresolver v1.6.2 // indirect
	modernc.org/libc v1.74.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.11.0 // indirect
	modernc.org/sqlite v1.55.0 // indirect
)

replace (
	github.com/idemgo/idem/adapters/fiber => ../adapters/fiber
	github.com/idemgo/idem/adapters/nethttp => ../adapters/nethttp
	github.com/idemgo/idem/core => ../core
	github.com/idemgo/idem/stores/gorm => ../stores/gorm
	github.com/idemgo/idem/stores/pgx => ../stores/pgx
	github.com/idemgo/idem/stores/redis => ../stores/redis
)

replace github.com/idemgo/idem/stores/sql => ../stores/sql

replace github.com/idemgo/idem/stores/internal => ../stores/internal
