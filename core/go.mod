module github.com/idemgo/idem/core

go 1.26

require (
	github.com/dunglas/httpsfv v1.1.2
	github.com/gowebpki/jcs v1.0.2
)
