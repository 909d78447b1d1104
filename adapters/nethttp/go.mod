module github.com/idemgo/idem/adapters/nethttp

go 1.26.8

require github.com/idemgo/idem/core v0.0.0-00010101000000-000000000000

require github.com/gowebpki/jcs v1.0.2 // indirect

replace github.com/idemgo/idem/core => ../../core
