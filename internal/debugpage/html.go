package debugpage

import (
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// Render writes the debug page of rep, reloading itself every refresh (0:
// never), its one script allowed by nonce (the Content-Security-Policy's).
// Everything it prints goes through html/template, which escapes it for
// where it lands (text, attribute, script); keys, namespaces, statements
// and application names are untrusted. The page's data is the bounded
// view of rep (view.go).
func Render(w io.Writer, rep Report, refresh time.Duration, nonce string) error {
	return debugTemplate.Execute(w, buildView(rep, refresh, nonce))
}

// breakable escapes s and lets the browser wrap it after the slashes of a
// path, after a comma and before a "(" that follows a word, so that a long
// path or function call wraps between words, never inside one.
func breakable(s string) template.HTML {
	var b strings.Builder
	start := 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '/' || s[i] == ',':
			b.WriteString(template.HTMLEscapeString(s[start : i+1]))
			b.WriteString("<wbr>")
			start = i + 1
		case s[i] == '(' && i > 0 && s[i-1] != ' ':
			b.WriteString(template.HTMLEscapeString(s[start:i]))
			b.WriteString("<wbr>")
			start = i
		}
	}
	b.WriteString(template.HTMLEscapeString(s[start:]))
	return template.HTML(b.String())
}

// thousands writes n with thousands separators.
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

var debugTemplate = template.Must(template.New("locks").Funcs(template.FuncMap{
	"age": formatAge,
	"clock": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("15:04:05.000")
	},
	"xact": func(s float64) string {
		if s < 0 {
			return "no transaction"
		}
		return fmt.Sprintf("transaction %s", formatAge(s))
	},
	"short":     func(s string, n int) string { return holders.Truncate(s, n) },
	"wbr":       breakable,
	"thousands": thousands,
	"plural": func(n int, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	},
	"holderLabel": func(h holders.Holder, pool string) string {
		if h.Process == "" && (h.Database == "" || h.Database == pool) {
			return connLabel(h.Conn, h.PID)
		}
		return holderLabel(h)
	},
	"sub": func(a, b float64) float64 { return a - b },
	"add": func(a, b float64) float64 { return a + b },
}).Parse(debugHTML))

const debugHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lockhooks: locks{{if .Summary.Waiting}} ({{.Summary.Waiting}} waiting){{end}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; padding: 0 16px 24px; max-width: 1500px; color: #1d1d1f; }
h1 { font-size: 20px; margin: 14px 0 4px; }
h2 { font-size: 17px; margin: 26px 0 6px; border-bottom: 1px solid #ccc; padding-bottom: 2px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
a { color: #1a56c4; }
.meta, .empty, .note, .more { color: #666; }
.more { margin: 2px 0 10px; }
.error, .note.warn { color: #a30000; }
table { border-collapse: collapse; width: 100%; margin: 4px 0 8px; }
th, td { text-align: left; vertical-align: top; padding: 4px 8px; border-bottom: 1px solid #eee; overflow-wrap: normal; word-break: normal; hyphens: none; }
th { background: #f5f5f7; font-weight: 600; white-space: nowrap; }
th.num, td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.nowrap { white-space: nowrap; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.stmt { color: #444; }
.state-parked { color: #8a5a00; font-weight: 600; }
.external { color: #8a5a00; }
tr.group th { background: #eef2fa; text-align: left; font-weight: 600; white-space: normal; }
table.compact { width: auto; }
.summary-lines td, .summary-lines th { padding: 3px 10px; }
.blockers { margin: 2px 0 0; padding-left: 16px; }
.cycle-banner { background: #ffecec; color: #a30000; padding: 6px 8px; border-radius: 4px; }
svg.graph { max-width: 100%; height: auto; border: 1px solid #eee; background: #fcfcfd; }
svg .edge { fill: none; stroke: #666; stroke-width: 1.5; }
svg .edge.cycle { stroke: #d00; stroke-width: 2.4; }
svg .edge-label { font: 11px system-ui, sans-serif; fill: #444; paint-order: stroke; stroke: #fcfcfd; stroke-width: 4px; stroke-linejoin: round; }
svg .edge-label.cycle { fill: #d00; font-weight: 600; }
svg .node rect { fill: #eef4ff; stroke: #3b6fd8; }
svg .node.external rect { fill: #fff4e5; stroke: #c77700; }
svg .node.group rect { fill: #f3f3f3; stroke: #777; stroke-dasharray: 4 2; }
svg .node text { font: 12px system-ui, sans-serif; fill: #1d1d1f; }
svg .node text.detail { font-size: 10.5px; fill: #555; }
details > summary { cursor: pointer; color: #444; margin: 10px 0 4px; }
@media (max-width: 720px) {
  table.cards, table.cards thead, table.cards tbody, table.cards tr, table.cards th, table.cards td { display: block; width: auto; }
  table.cards thead { display: none; }
  table.cards tr { border: 1px solid #ddd; border-radius: 4px; margin: 0 0 8px; padding: 4px; }
  table.cards td { border: none; padding: 2px 4px; text-align: left; white-space: normal; }
  table.cards td::before { content: attr(data-label) ": "; font-weight: 600; color: #555; font-family: system-ui, sans-serif; }
}
</style>
</head>
<body>
<h1>lockhooks: locks</h1>
<p class="meta">Generated {{.Generated.Format "2006-01-02 15:04:05.000 MST"}}.
{{if gt .RefreshMS 0}}Reloads every {{.RefreshMS}} ms (<a href="?refresh=0">stop</a>).{{else}}Not reloading (<a href="?refresh=2">reload every 2s</a>).{{end}}
<a href="?format=json">JSON</a></p>
<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>
<marker id="lh-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#666"/></marker>
<marker id="lh-arrow-cycle" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#d00"/></marker>
</defs></svg>

<section id="summary">
<h2>Summary: {{thousands .Summary.Waiting}} waiting, {{thousands .Summary.Held}} held</h2>
{{with .Summary}}
<table class="summary-lines compact cards"><thead><tr><th>database</th><th class="num">waiting</th><th class="num">longest wait</th><th class="num">held</th><th class="num">events</th></tr></thead><tbody>
{{range .Lines}}<tr class="db-line"><td data-label="database"><a href="#{{.Anchor}}">{{.Label}}</a>{{if .Error}} <span class="error">cannot be shown</span>{{end}}</td>
<td data-label="waiting" class="num">{{thousands .WaitersTotal}}</td>
<td data-label="longest wait" class="num">{{if .WaitersTotal}}{{age .Longest}}{{end}}</td>
<td data-label="held" class="num">{{thousands .HeldTotal}}</td>
<td data-label="events" class="num">{{.EventsTotal}}</td></tr>
{{end}}</tbody></table>

<h3>Longest waits</h3>
{{if .Waits}}
<table class="summary-waits cards"><thead><tr><th class="num">waiting</th><th>waits for</th><th>waiter</th><th>held by</th><th>holder took it at</th><th class="num">held for</th>{{if $.Multi}}<th>database</th>{{end}}</tr></thead><tbody>
{{range .Waits}}<tr class="summary-wait" data-conn="{{.Waiter.Conn}}">
<td data-label="waiting" class="num" title="since {{clock .Waiter.Since}}">{{if .Waiter.WaitSeconds}}{{age .Waiter.WaitSeconds}}{{end}}</td>
<td data-label="waits for" class="mono">{{wbr .What}}</td>
<td data-label="waiter">{{if .Waiter.Conn}}<span class="nowrap">conn #{{.Waiter.Conn}}</span>{{end}}{{if .Similar}} <span class="meta nowrap">and {{.Similar}} like it</span>{{end}}{{if .Waiter.Site}}<br><span class="mono">{{wbr .Waiter.Site}}</span>{{end}}</td>
<td data-label="held by">{{if .Holder.Known}}<span class="nowrap{{if .Holder.External}} external{{end}}">{{.Holder.Label}}</span>{{if .Holder.App}} <code>{{.Holder.App}}</code>{{end}}{{if .Holder.State}}<br><span class="meta">{{.Holder.State}}</span>{{end}}{{if .Others}} <span class="meta">and {{.Others}} more</span>{{end}}{{else}}<span class="meta">unknown</span>{{end}}</td>
<td data-label="holder took it at" class="mono">{{if .Holder.Site}}{{wbr .Holder.Site}}{{else if .Holder.Query}}<span class="stmt">{{wbr (short .Holder.Query 120)}}</span>{{end}}</td>
<td data-label="held for" class="num">{{if ge .Holder.Held 0.0}}{{age .Holder.Held}}{{end}}</td>
{{if $.Multi}}<td data-label="database" class="nowrap"><a href="#{{.DB.Anchor}}">{{.DB.Label}}</a></td>{{end}}
</tr>
{{end}}</tbody></table>
{{if gt .MoreWaits 0}}<p class="more">and {{thousands .MoreWaits}} more {{plural .MoreWaits "wait" "waits"}}, listed per database below.</p>{{end}}
{{else}}<p class="empty">Nobody waits.</p>{{end}}

{{if .Holders}}
<h3>Holders blocking the most waiters</h3>
<table class="summary-holders cards"><thead><tr><th>holder</th><th class="num">blocks</th><th class="num">longest wait</th><th>they wait for</th><th>took it at</th><th class="num">held for</th>{{if $.Multi}}<th>database</th>{{end}}</tr></thead><tbody>
{{range .Holders}}<tr class="summary-holder">
<td data-label="holder"><span class="nowrap{{if .Holder.External}} external{{end}}">{{.Holder.Label}}</span>{{if .Holder.App}} <code>{{.Holder.App}}</code>{{end}}{{if .Holder.State}}<br><span class="meta">{{.Holder.State}}</span>{{end}}</td>
<td data-label="blocks" class="num">{{.Blocks}}</td>
<td data-label="longest wait" class="num">{{age .Longest}}</td>
<td data-label="they wait for" class="mono">{{wbr .What}}</td>
<td data-label="took it at" class="mono">{{if .Holder.Site}}{{wbr .Holder.Site}}{{else if .Holder.Query}}<span class="stmt">{{wbr (short .Holder.Query 120)}}</span>{{end}}</td>
<td data-label="held for" class="num">{{if ge .Holder.Held 0.0}}{{age .Holder.Held}}{{end}}</td>
{{if $.Multi}}<td data-label="database" class="nowrap"><a href="#{{.DB.Anchor}}">{{.DB.Label}}</a></td>{{end}}
</tr>
{{end}}</tbody></table>
{{if gt .MoreHolders 0}}<p class="more">and {{.MoreHolders}} more {{plural .MoreHolders "holder" "holders"}}.</p>{{end}}
{{end}}
{{end}}
</section>

{{range $db := .Databases}}
<section class="database" id="{{$db.Anchor}}">
<h2>{{$db.Label}}: {{thousands $db.WaitersTotal}} waiting, {{thousands $db.HeldTotal}} held</h2>
{{if $db.Error}}<p class="error">{{$db.Error}}</p>{{end}}
{{range $db.Notes}}<p class="note warn">{{.}}</p>{{end}}

{{if $db.Waiters}}
<h3>Waiting</h3>
<table class="waiters cards"><thead><tr><th class="num">waiting</th><th>waits for</th><th>waiter, asked at</th><th>held by</th></tr></thead>
<tbody>
{{range $db.Waiters}}<tr class="waiter" data-conn="{{.Conn}}">
<td data-label="waiting" class="num" title="{{if not .Since.IsZero}}since {{clock .Since}}{{end}}">{{if .WaitSeconds}}{{age .WaitSeconds}}{{end}}</td>
<td data-label="waits for"><span class="meta">{{.Kind}}{{if .Mode}} {{.Mode}}{{end}}</span><br><span class="mono">{{if .Namespace}}{{wbr (short .Namespace 48)}} / {{end}}{{wbr (short .Keys 120)}}</span>{{if .Statement}}<br><code class="stmt">{{wbr (short .Statement 200)}}</code>{{end}}{{if .WaitEvent}}<br><span class="meta">{{.WaitEvent}}</span>{{end}}</td>
<td data-label="waiter, asked at"><span class="nowrap">{{if .Conn}}conn #{{.Conn}}{{end}}{{if .PID}} · pid {{.PID}}{{end}}</span>{{if .Site}}<br><span class="mono">{{wbr .Site}}</span>{{end}}</td>
<td data-label="held by">
{{range .Holders}}<div class="holder" data-conn="{{.Conn}}">{{if .Queued}}<span class="meta">queued ahead:</span> {{end}}<span class="nowrap">{{holderLabel . $db.Pool}}</span>{{if .Key}} holds <code>{{wbr (short .Key 80)}}</code>{{end}}{{if .Site}}, {{if eq .SiteKind "took_lock"}}taken{{else}}transaction begun{{end}} at <code>{{wbr .Site}}</code>{{end}}{{if not .Since.IsZero}} <span class="meta nowrap">since {{clock .Since}}</span>{{end}}{{if and .Queued .Statement}}<br><code class="stmt">{{wbr (short .Statement 200)}}</code>{{end}}</div>{{end}}
{{if .Blockers}}<ul class="blockers">{{range .Blockers}}<li class="blocker" data-pid="{{.PID}}">{{if .Waiting}}<span class="meta">queued ahead:</span> {{end}}<span class="nowrap">backend pid {{.PID}}</span>{{if .ApplicationName}} · <code>{{.ApplicationName}}</code>{{end}} · {{.State}} · <span class="nowrap">{{xact .XactSeconds}}</span>{{if .Query}}<br><code class="stmt">{{wbr (short .Query 200)}}</code>{{end}}</li>{{end}}</ul>{{end}}
{{if and (not .Holders) (not .Blockers)}}<span class="meta">unknown</span>{{end}}
</td>
</tr>
{{end}}</tbody></table>
{{if gt $db.MoreWaiters 0}}<p class="more">and {{thousands $db.MoreWaiters}} more waiting (the longest are listed; <a href="?format=json">JSON</a> has the oldest {{len $db.Waiters}}+).</p>{{end}}
{{else}}<p class="empty">Nobody waits.</p>{{end}}

{{if $db.Graph.Edges}}
<h3>Wait-for graph</h3>
{{if $db.Graph.Cycle}}<p class="cycle-banner">In-process cycle: these connections wait for each other; they are stuck until a context or timeout ends one of the waits.</p>{{end}}
<svg class="graph" width="{{$db.Graph.W}}" height="{{$db.Graph.H}}" viewBox="0 0 {{$db.Graph.W}} {{$db.Graph.H}}" role="img" aria-label="wait-for graph of {{$db.Label}}">
{{range $db.Graph.Edges}}<path class="edge{{if .InCycle}} cycle{{end}}" data-from="{{.From}}" data-to="{{.To}}" d="{{.Path}}" marker-end="{{if .InCycle}}url(#lh-arrow-cycle){{else}}url(#lh-arrow){{end}}"><title>{{.From}} waits for {{.To}}: {{.Title}}</title></path>
<text class="edge-label{{if .InCycle}} cycle{{end}}" x="{{.LX}}" y="{{.LY}}">{{.Label}}</text>
{{end}}{{range $db.Graph.Nodes}}<g class="node{{if .External}} external{{end}}{{if .Group}} group{{end}}" data-id="{{.ID}}"><rect x="{{sub .X 85}}" y="{{sub .Y 20}}" width="170" height="40" rx="6"/><text x="{{.X}}" y="{{if .Detail}}{{sub .Y 3}}{{else}}{{add .Y 4}}{{end}}" text-anchor="middle">{{short .Label 26}}</text>{{if .Detail}}<text class="detail" x="{{.X}}" y="{{add .Y 12}}" text-anchor="middle">{{short .Detail 28}}</text>{{end}}<title>{{.Title}}</title></g>
{{end}}</svg>
{{if or $db.Graph.Grouped $db.Graph.Hidden}}<p class="more">{{if $db.Graph.Grouped}}{{$db.Graph.Grouped}} waiters are drawn as group nodes (more than 3 waiting for one holder).{{end}}{{if $db.Graph.Hidden}} {{$db.Graph.Hidden}} more {{plural $db.Graph.Hidden "node is" "nodes are"}} not drawn; the tables list them.{{end}}</p>{{end}}
{{end}}

<h3>Held locks</h3>
{{if $db.Groups}}
<table class="held cards"><thead><tr><th>lock</th><th>connection</th><th class="num">held for</th><th>taken at</th><th class="num">count</th><th class="num">waiters</th><th>mode · scope · state</th></tr></thead>
{{range $db.Groups}}<tbody class="held-group" data-kind="{{.Kind}}" data-namespace="{{.Namespace}}">
<tr class="group"><th colspan="7">{{.Kind}}{{if .Namespace}} <code>{{wbr (short .Namespace 60)}}</code>{{end}}: {{thousands .Count}} held{{if .Holders}} by {{range $i, $h := .Holders}}{{if $i}}, {{end}}<span class="nowrap">#{{$h.Conn}} ({{thousands $h.Count}})</span>{{end}}{{end}}{{if .Waiters}}; {{thousands .Waiters}} waiting for them{{end}}</th></tr>
{{range .Lines}}{{with .First}}<tr class="held-lock" data-conn="{{.Conn}}" data-key="{{.Key}}">{{end}}
<td data-label="lock" class="mono">{{if eq (len .Locks) 1}}{{with .First}}{{if .Name}}<strong>{{wbr (short .Name 60)}}</strong> <span class="meta">{{.Key}}</span>{{else}}{{wbr (short .Key 60)}}{{end}}{{if .AdvisoryKey}} <span class="meta">key {{.AdvisoryKey}}</span>{{end}}{{if .Statement}}<br><span class="stmt">{{wbr (short .Statement 200)}}</span>{{end}}{{end}}{{else}}{{range $i, $l := .Locks}}{{if $i}}, {{end}}<span class="nowrap">{{if $l.Name}}{{short $l.Name 40}}{{else}}{{short $l.Key 40}}{{end}}{{if $l.Waiters}} <span class="meta">({{$l.Waiters}}&nbsp;waiting)</span>{{end}}</span>{{end}}{{end}}</td>
{{with .First}}<td data-label="connection" class="nowrap">#{{.Conn}}{{if .PID}}<br><span class="meta">pid {{.PID}}</span>{{end}}</td>
<td data-label="held for" class="num" title="{{if not .Since.IsZero}}since {{clock .Since}}{{end}}">{{if not .Since.IsZero}}{{age .HeldSeconds}}{{end}}</td>
<td data-label="taken at" class="mono">{{wbr .Site}}</td>{{end}}
<td data-label="count" class="num">{{if eq (len .Locks) 1}}{{.First.Count}}{{else}}{{len .Locks}} locks{{end}}</td>
<td data-label="waiters" class="num">{{if .Waiters}}{{.Waiters}}{{end}}</td>
{{with .First}}<td data-label="mode · scope · state" class="meta"><span class="nowrap">{{.Mode}}</span> · <span class="nowrap">{{.Scope}}</span> · <span class="nowrap state-{{.State}}">{{.State}}</span></td>{{end}}
</tr>
{{end}}{{if gt .More 0}}<tr class="more-rows"><td colspan="7" class="more">and {{thousands .More}} more{{if .Pages}} (<a href="{{.Pages}}">all, as JSON pages</a>){{end}}</td></tr>{{end}}
</tbody>
{{end}}</table>
{{if $db.MoreGroups}}<p class="more">and {{$db.MoreGroups}} more {{plural $db.MoreGroups "group" "groups"}} ({{thousands $db.MoreGrouped}} locks) in the <a href="?format=json">JSON</a>.</p>{{end}}
{{else}}<p class="empty">No lock held.</p>{{end}}

<h3>Recent events</h3>
{{if $db.Events}}
<table class="events cards"><thead><tr><th class="num">time</th><th>event</th><th>what</th></tr></thead><tbody>
{{range $db.Events}}<tr class="event"><td data-label="time" class="num">{{clock .Time}}</td><td data-label="event" class="nowrap">{{.Kind}}</td><td data-label="what" class="mono">{{wbr (short .Message 400)}}</td></tr>
{{end}}</tbody></table>
{{if gt $db.MoreEvents 0}}<p class="more">and {{$db.MoreEvents}} older {{plural $db.MoreEvents "event" "events"}} in the <a href="?format=json">JSON</a>.</p>{{end}}
{{else}}<p class="empty">No events.</p>{{end}}

<details><summary>Counters</summary>
<table class="counters compact"><tbody>
{{range $db.Counters}}<tr><td>{{.Name}}</td><td class="num">{{.Value}}</td></tr>
{{end}}</tbody></table>
</details>
</section>
{{end}}
{{range .Quiet}}<section class="database quiet" id="{{.Anchor}}"><h2>{{.Label}}: nothing held, nobody waits, no events</h2>
<details><summary>Counters</summary>
<table class="counters compact"><tbody>
{{range .Counters}}<tr><td>{{.Name}}</td><td class="num">{{.Value}}</td></tr>
{{end}}</tbody></table>
</details>
</section>
{{else}}{{if not .Databases}}<p class="empty">No database was given to lockhooks.DebugHandler.</p>{{end}}
{{end}}
<p class="meta">Statement text is shown; bound arguments never are. Serve this page only behind your service's own authentication.</p>
{{if gt .RefreshMS 0}}<script nonce="{{.Nonce}}">
document.documentElement.setAttribute("data-reload", "scheduled");
setTimeout(function () { location.reload(); }, {{.RefreshMS}});
</script>{{end}}
</body>
</html>
`
