package server

import (
	"strings"
)

// configurationDoc renders docs/configuration.md from the settings tables, so that the
// documentation of every key is the table's (TestConfigurationDoc fails when the file
// and the tables disagree; `go generate ./server` rewrites the file).
func configurationDoc() string {
	var b strings.Builder
	b.WriteString(`# Configuration

<!-- Generated from server/settings.go by ` + "`go generate ./server`" + `; do not edit. -->

The conductor reads one JSON object from ` + "`CONDUCTOR_CONFIG_PATH`" + ` (default
` + "`$HOME/.mooncake/conductor_config.json`" + `; a missing file means every default and no static
services). An unknown key, a value of the wrong type or out of its bounds stops the
process with an error naming the file and the key; an invalid ` + "`kvevent_instance`" + ` entry is
logged and skipped, and the other entries start. ` + "`CONDUCTOR_LOG_LEVEL`" + ` (debug, info, warn,
error) sets the log level.

## Keys

`)
	writeTable(&b, "", fileSettings())
	b.WriteString(`
## The ` + "`cluster`" + ` object

`)
	writeTable(&b, "cluster.", clusterSettings())
	b.WriteString(`
Example: ` + "`" + `{"cluster": {"etcd_endpoints": ["http://127.0.0.1:2379"], "advertise_url": "http://10.0.0.5:13333"}}` + "`" + `.
`)
	return b.String()
}

func writeTable[T any](b *strings.Builder, prefix string, table []setting[T]) {
	b.WriteString("| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n")
	for i := range table {
		s := &table[i]
		for _, cell := range []string{"`" + prefix + s.key + "`", s.typ, s.def, s.bounds, s.doc} {
			b.WriteString("| ")
			b.WriteString(strings.ReplaceAll(cell, "|", `\|`))
			b.WriteString(" ")
		}
		b.WriteString("|\n")
	}
}
