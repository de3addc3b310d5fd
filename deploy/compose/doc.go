// Package compose holds no Go code of its own: its tests load the
// repository's docker-compose.yaml with the compose specification's own
// loader (compose-go) and check it against the ratelimit-authz binary, the
// Dockerfile's stages and the files it mounts.
package compose
