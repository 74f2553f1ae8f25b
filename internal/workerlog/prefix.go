package workerlog

import "strconv"

// PrefixTemplateEnv is torchrun's variable for the template of the console
// prefix of worker output lines.
const PrefixTemplateEnv = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"

// PrefixVars are what a prefix template may name: ${rank}, ${local_rank},
// ${role_name} and ${hostname}, as torchrun's.
type PrefixVars struct {
	Rank      int
	LocalRank int
	RoleName  string
	Hostname  string
}

// ExpandPrefix substitutes vars into template with the rules of Python's
// string.Template.safe_substitute, which torchrun applies to
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: $name or ${name} is replaced when
// name is rank, local_rank, role_name or hostname; $$ is a $; any other $
// (an unknown name, a $ not followed by a name) is kept as it is. The result
// is the whole prefix: torchrun adds no separator after it.
func ExpandPrefix(template string, vars PrefixVars) string {
	value := func(name string) (string, bool) {
		switch name {
		case "rank":
			return strconv.Itoa(vars.Rank), true
		case "local_rank":
			return strconv.Itoa(vars.LocalRank), true
		case "role_name":
			return vars.RoleName, true
		case "hostname":
			return vars.Hostname, true
		}
		return "", false
	}
	out := make([]byte, 0, len(template)+16)
	for i := 0; i < len(template); {
		c := template[i]
		if c != '$' || i+1 == len(template) {
			out = append(out, c)
			i++
			continue
		}
		next := template[i+1]
		switch {
		case next == '$':
			out = append(out, '$')
			i += 2
			continue
		case next == '{':
			if n := identLen(template[i+2:]); n > 0 && i+2+n < len(template) && template[i+2+n] == '}' {
				if v, ok := value(template[i+2 : i+2+n]); ok {
					out = append(out, v...)
					i += n + 3
					continue
				}
			}
		default:
			if n := identLen(template[i+1:]); n > 0 {
				if v, ok := value(template[i+1 : i+1+n]); ok {
					out = append(out, v...)
					i += n + 1
					continue
				}
			}
		}
		out = append(out, '$')
		i++
	}
	return string(out)
}

// identLen is the length of the Python identifier ([_a-zA-Z][_a-zA-Z0-9]*,
// ASCII) at the start of s, 0 if none.
func identLen(s string) int {
	n := 0
	for n < len(s) {
		c := s[n]
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (n == 0 || c < '0' || c > '9') {
			break
		}
		n++
	}
	return n
}
