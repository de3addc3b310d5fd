// Package rlsconfig reads envoyproxy/ratelimit's YAML configuration as is,
// so that its users can point the same files at ratelimit-authz: parse and
// validate (every problem at once, file:line:column and upstream's
// message), load upstream's runtime directory layout, find the most
// specific rule for a request descriptor, and name each rule's counters.
package rlsconfig
