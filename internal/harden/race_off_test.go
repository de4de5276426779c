//go:build !race

package harden

const raceBuild = false
