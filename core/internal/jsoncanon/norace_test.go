//go:build !race

package jsoncanon

const raceEnabled = false
