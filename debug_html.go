package lockhooks

import (
	"fmt"
	"html/template"
	"io"
	"sort"
	"time"
)

// renderDebugHTML writes the debug page. Everything it prints goes through
// html/template, which escapes it for where it lands (text, attribute,
// script); keys, namespaces, statements and application names are
// untrusted.
func renderDebugHTML(w io.Writer, rep debugReport, refresh time.Duration, nonce string) error {
	return debugTemplate.Execute(w, debugPage{Report: rep, RefreshMS: refresh.Milliseconds(), Nonce: nonce})
}

// debugPage is the template's data.
type debugPage struct {
	Report    debugReport
	RefreshMS int64
	Nonce     string
}

// counterRow is one counter, for a stable order on the page.
type counterRow struct {
	Name  string
	Value int64
}

var debugTemplate = template.Must(template.New("locks").Funcs(template.FuncMap{
	"age": func(seconds float64) string {
		d := time.Duration(seconds * float64(time.Second))
		switch {
		case d >= time.Minute:
			return d.Round(time.Second).String()
		case d >= time.Second:
			return d.Round(100 * time.Millisecond).String()
		}
		return d.Round(time.Millisecond).String()
	},
	"clock": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("15:04:05.000")
	},
	"counters": func(m map[string]int64) []counterRow {
		rows := make([]counterRow, 0, len(m))
		for k, v := range m {
			rows = append(rows, counterRow{k, v})
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
		return rows
	},
	"xact": func(s float64) string {
		if s < 0 {
			return "no transaction"
		}
		return fmt.Sprintf("%.1fs", s)
	},
	"half":  func(v float64) float64 { return v / 2 },
	"short": func(s string, n int) string { return truncate(s, n) },
	"sub":   func(a, b float64) float64 { return a - b },
	"add":   func(a, b float64) float64 { return a + b },
}).Parse(debugHTML))

const debugHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lockhooks: locks</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; padding: 0 12px 24px; max-width: 1200px; color: #1d1d1f; }
h1 { font-size: 20px; margin: 14px 0 4px; }
h2 { font-size: 17px; margin: 22px 0 6px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.meta, .empty, .note { color: #666; }
.error, .note.warn { color: #a30000; }
table { border-collapse: collapse; width: 100%; margin: 4px 0 10px; }
th, td { text-align: left; vertical-align: top; padding: 4px 6px; border-bottom: 1px solid #eee; overflow-wrap: anywhere; }
th { background: #f5f5f7; font-weight: 600; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.state-parked { color: #8a5a00; font-weight: 600; }
.blockers { margin: 4px 0 0; padding-left: 16px; }
svg.graph { max-width: 100%; height: auto; border: 1px solid #eee; background: #fcfcfd; }
svg .edge-label { font: 11px system-ui, sans-serif; fill: #444; paint-order: stroke; stroke: #fcfcfd; stroke-width: 4px; stroke-linejoin: round; }
svg .edge-label.cycle { fill: #d00; font-weight: 600; }
table.counters { width: auto; }
svg .node rect { fill: #eef4ff; stroke: #3b6fd8; }
svg .node.external rect { fill: #fff4e5; stroke: #c77700; }
svg .node text { font: 12px system-ui, sans-serif; fill: #1d1d1f; }
svg .node text.detail { font-size: 10.5px; fill: #555; }
svg .edge { stroke: #555; stroke-width: 1.6; }
svg .edge.cycle { stroke: #d00; stroke-width: 2.6; }
.cycle-banner { background: #ffecec; color: #a30000; padding: 6px 8px; border-radius: 4px; }
@media (max-width: 720px) {
  table.cards, table.cards thead, table.cards tbody, table.cards tr, table.cards th, table.cards td { display: block; width: auto; }
  table.cards thead { display: none; }
  table.cards tr { border: 1px solid #ddd; border-radius: 4px; margin: 0 0 8px; padding: 4px; }
  table.cards td { border: none; padding: 2px 4px; }
  table.cards td::before { content: attr(data-label) ": "; font-weight: 600; color: #555; font-family: system-ui, sans-serif; }
}
</style>
</head>
<body>
<h1>lockhooks: locks</h1>
<p class="meta">Generated {{.Report.Generated.Format "2006-01-02 15:04:05.000 MST"}}.
{{if gt .RefreshMS 0}}Reloads every {{.RefreshMS}} ms (<a href="?refresh=0">stop</a>).{{else}}Not reloading (<a href="?refresh=2">reload every 2s</a>).{{end}}
<a href="?format=json">JSON</a></p>
<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>
<marker id="lh-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker>
<marker id="lh-arrow-cycle" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#d00"/></marker>
</defs></svg>
{{range $db := .Report.Databases}}
<section class="database" id="db-{{$db.Index}}">
<h2>Database {{$db.Index}}{{if $db.Dialect}} ({{$db.Dialect}}){{end}}</h2>
{{if $db.Error}}<p class="error">{{$db.Error}}</p>{{end}}
{{range $db.Notes}}<p class="note warn">{{.}}</p>{{end}}

<h3>Held locks ({{len $db.Held}})</h3>
{{if $db.Held}}
<table class="held cards"><thead><tr><th>kind</th><th>mode / scope</th><th>lock</th><th>connection</th><th>state</th><th>held for</th><th>taken at</th><th>count</th></tr></thead>
<tbody>
{{range $db.Held}}<tr class="held-lock" data-conn="{{.Conn}}" data-key="{{.Key}}">
<td data-label="kind">{{.Kind}}</td>
<td data-label="mode / scope">{{.Mode}} / {{.Scope}}</td>
<td data-label="lock" class="mono">{{if .Namespace}}{{.Namespace}} / {{end}}{{.Key}}{{if .Name}} ({{.Name}}){{end}}{{if .Statement}}<br>{{.Statement}}{{end}}</td>
<td data-label="connection">#{{.Conn}}{{if .PID}} · pid {{.PID}}{{end}}</td>
<td data-label="state" class="state-{{.State}}">{{.State}}</td>
<td data-label="held for">{{if not .Since.IsZero}}{{age .HeldSeconds}} <span class="meta">(since {{clock .Since}})</span>{{end}}</td>
<td data-label="taken at" class="mono">{{.Site}}</td>
<td data-label="count">{{.Count}}</td>
</tr>
{{end}}</tbody></table>
{{else}}<p class="empty">No lock held.</p>{{end}}

<h3>Waiting ({{len $db.Waiters}})</h3>
{{if $db.Waiters}}
<table class="waiters cards"><thead><tr><th>kind</th><th>waits for</th><th>connection</th><th>waiting for</th><th>asked at</th><th>held by</th></tr></thead>
<tbody>
{{range $db.Waiters}}<tr class="waiter" data-conn="{{.Conn}}">
<td data-label="kind">{{.Kind}}{{if .Mode}} ({{.Mode}}){{end}}</td>
<td data-label="waits for" class="mono">{{if .Namespace}}{{.Namespace}} / {{end}}{{.Keys}}{{if .Statement}}{{if or .Namespace .Keys}}<br>{{end}}{{.Statement}}{{end}}{{if .WaitEvent}}<br><span class="meta">{{.WaitEvent}}</span>{{end}}</td>
<td data-label="connection">{{if .Conn}}#{{.Conn}}{{end}}{{if .PID}} · pid {{.PID}}{{end}}</td>
<td data-label="waiting for">{{if not .Since.IsZero}}{{age .WaitSeconds}} <span class="meta">(since {{clock .Since}})</span>{{end}}</td>
<td data-label="asked at" class="mono">{{.Site}}</td>
<td data-label="held by">
{{range .Holders}}<div class="holder" data-conn="{{.Conn}}">connection #{{.Conn}}{{if .PID}} · pid {{.PID}}{{end}}{{if .Key}} holds <code>{{.Key}}</code>{{end}}{{if .Site}}, taken at <code>{{.Site}}</code>{{end}}{{if not .Since.IsZero}} (since {{clock .Since}}){{end}}</div>{{end}}
{{if .Blockers}}<ul class="blockers">{{range .Blockers}}<li class="blocker" data-pid="{{.PID}}">backend pid {{.PID}}{{if .Conn}} = connection #{{.Conn}}{{end}}{{if .ApplicationName}} · <code>{{.ApplicationName}}</code>{{end}} · {{.State}} · {{xact .XactSeconds}}{{if .Query}}<br><code>{{.Query}}</code>{{end}}</li>{{end}}</ul>{{end}}
{{if and (not .Holders) (not .Blockers)}}<span class="meta">unknown</span>{{end}}
</td>
</tr>
{{end}}</tbody></table>
{{else}}<p class="empty">Nobody waits.</p>{{end}}

<h3>Wait-for graph</h3>
{{if $db.Graph.Edges}}
{{if $db.Graph.Cycle}}<p class="cycle-banner">In-process cycle: these connections wait for each other; they are stuck until a context or timeout ends one of the waits.</p>{{end}}
<svg class="graph" width="{{$db.Graph.W}}" height="{{$db.Graph.H}}" viewBox="0 0 {{$db.Graph.W}} {{$db.Graph.H}}" role="img" aria-label="wait-for graph of database {{$db.Index}}">
{{range $db.Graph.Edges}}<line class="edge{{if .InCycle}} cycle{{end}}" data-from="{{.From}}" data-to="{{.To}}" x1="{{.X1}}" y1="{{.Y1}}" x2="{{.X2}}" y2="{{.Y2}}" marker-end="{{if .InCycle}}url(#lh-arrow-cycle){{else}}url(#lh-arrow){{end}}"><title>{{.From}} waits for {{.To}}: {{.Label}}</title></line>
<text class="edge-label{{if .InCycle}} cycle{{end}}" x="{{half (add .X1 .X2)}}" y="{{sub (half (add .Y1 .Y2)) 6}}" text-anchor="middle">{{.Label}}</text>
{{end}}{{range $db.Graph.Nodes}}<g class="node{{if .External}} external{{end}}" data-id="{{.ID}}"><rect x="{{sub .X 80}}" y="{{sub .Y 20}}" width="160" height="40" rx="6"/><text x="{{.X}}" y="{{if .Detail}}{{sub .Y 3}}{{else}}{{add .Y 4}}{{end}}" text-anchor="middle">{{.Label}}</text>{{if .Detail}}<text class="detail" x="{{.X}}" y="{{add .Y 12}}" text-anchor="middle">{{short .Detail 24}}</text>{{end}}<title>{{.Label}}{{if .Detail}} ({{.Detail}}){{end}}</title></g>
{{end}}</svg>
{{else}}<p class="empty">No waits.</p>{{end}}

<h3>Recent events ({{len $db.Events}})</h3>
{{if $db.Events}}
<table class="events cards"><thead><tr><th>time</th><th>event</th><th>what</th></tr></thead><tbody>
{{range $db.Events}}<tr class="event"><td data-label="time">{{clock .Time}}</td><td data-label="event">{{.Kind}}</td><td data-label="what" class="mono">{{.Message}}</td></tr>
{{end}}</tbody></table>
{{else}}<p class="empty">No events.</p>{{end}}

<h3>Counters</h3>
<table class="counters"><tbody>
{{range counters $db.Counters}}<tr><td data-label="counter">{{.Name}}</td><td data-label="value">{{.Value}}</td></tr>
{{end}}</tbody></table>
</section>
{{else}}<p class="empty">No database was given to lockhooks.DebugHandler.</p>
{{end}}
<p class="meta">Statement text is shown; bound arguments never are. Serve this page only behind your service's own authentication.</p>
{{if gt .RefreshMS 0}}<script nonce="{{.Nonce}}">
document.documentElement.setAttribute("data-reload", "scheduled");
setTimeout(function () { location.reload(); }, {{.RefreshMS}});
</script>{{end}}
</body>
</html>
`
