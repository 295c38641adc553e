// Package report turns benchmark results into what people read: aligned
// text tables on the terminal, markdown tables, PNG charts, one JSON file
// per scenario, and BENCHMARKS.md assembled from those files.
package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Table is one result table.
type Table struct {
	Title  string     `json:"title"`
	Header []string   `json:"header"`
	Rows   [][]string `json:"rows"`
	Notes  []string   `json:"notes,omitempty"` // lines printed under the table
	// TextColumns is how many leading columns hold text (left-aligned in
	// markdown); the rest hold numbers (right-aligned). Defaults to 1.
	TextColumns int `json:"text_columns,omitempty"`
}

// Add appends a row; each cell is formatted with %v (floats with %.3g
// unless already strings).
func (t *Table) Add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		switch v := c.(type) {
		case string:
			row[i] = v
		case float64:
			row[i] = fmt.Sprintf("%.3g", v)
		default:
			row[i] = fmt.Sprint(v)
		}
	}
	t.Rows = append(t.Rows, row)
}

// WriteText writes the table with aligned columns.
func (t Table) WriteText(w io.Writer) {
	if t.Title != "" {
		fmt.Fprintln(w, t.Title)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(t.Header, "\t")+"\t")
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	tw.Flush()
	for _, n := range t.Notes {
		fmt.Fprintln(w, n)
	}
}

// Markdown returns the table as GitHub-flavoured markdown, the text columns
// left-aligned and the rest right-aligned.
func (t Table) Markdown() string {
	var b strings.Builder
	if t.Title != "" {
		fmt.Fprintf(&b, "**%s**\n\n", t.Title)
	}
	b.WriteString("| " + strings.Join(escape(t.Header), " | ") + " |\n|")
	text := t.TextColumns
	if text == 0 {
		text = 1
	}
	for i := range t.Header {
		if i < text {
			b.WriteString(" :--- |")
		} else {
			b.WriteString(" ---: |")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		b.WriteString("| " + strings.Join(escape(r), " | ") + " |\n")
	}
	for _, n := range t.Notes {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}

func escape(cells []string) []string {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = strings.ReplaceAll(c, "|", `\|`)
	}
	return out
}
