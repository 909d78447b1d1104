package idemgorm_test

import "github.com/idemgo/idem/stores/gorm/idemgormtest"

// The tests' databases and fixtures live in idemgormtest, which the
// conformance module uses too: a fresh store table plus a business table
// per test, on servers that fail the test when unreachable.
type fixture = idemgormtest.Fixture

var (
	dialects   = idemgormtest.Dialects
	newFixture = idemgormtest.NewFixture
	newBackend = idemgormtest.NewBackend
	openDB     = idemgormtest.OpenDB
	gormConfig = idemgormtest.GormConfig
	pgDSN      = idemgormtest.PostgresDSN
	randSuffix = idemgormtest.RandSuffix
)
