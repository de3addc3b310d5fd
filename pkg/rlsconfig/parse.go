package rlsconfig

// Parse parses and validates configuration files, each one domain. On any
// problem it returns a nil *Config and a rules.Problems listing every one
// (file:line:column: upstream's message), files in name order.
func Parse(files []File, opts Options) (*Config, error) {
	panic("todo")
}
