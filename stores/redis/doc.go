// Package idemredis is an idem.Store on Redis or Valkey through go-redis v9.
package idemredis
