//go:build race

package harden

// raceBuild: a race build's core is several GB of shadow memory; the
// test then only checks that a core is written (coreCap).
const raceBuild = true
