package report

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Bars is one series of a grouped bar chart: a value per category.
type Bars struct {
	Name   string
	Values []float64
}

// BarChart writes a grouped bar chart to path (PNG): one group per
// category, one bar per series in each group.
func BarChart(path, title, ylabel string, categories []string, series []Bars) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	width := vg.Points(60 / float64(max(len(series), 1)))
	for i, s := range series {
		if len(s.Values) != len(categories) {
			return fmt.Errorf("chart %s: series %q has %d values for %d categories", path, s.Name, len(s.Values), len(categories))
		}
		b, err := plotter.NewBarChart(plotter.Values(s.Values), width)
		if err != nil {
			return fmt.Errorf("chart %s: series %q: %w", path, s.Name, err)
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = vg.Length(0)
		b.Offset = width * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(b)
		p.Legend.Add(s.Name, b)
	}
	p.Legend.Top = true
	p.NominalX(categories...)
	p.Add(plotter.NewGrid())
	return p.Save(vg.Length(max(5, 1.4*float64(len(categories))))*vg.Inch, 4*vg.Inch, path)
}

// Line is one series of a line chart.
type Line struct {
	Name string
	X, Y []float64
}

// LineChart writes a line chart with points to path (PNG). hline, when not
// nil, draws a dashed horizontal reference line at that value, labelled.
func LineChart(path, title, xlabel, ylabel string, series []Line, hline *Reference) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	for i, s := range series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("chart %s: series %q has %d x and %d y values", path, s.Name, len(s.X), len(s.Y))
		}
		pts := make(plotter.XYs, len(s.X))
		for j := range s.X {
			pts[j].X, pts[j].Y = s.X[j], s.Y[j]
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("chart %s: series %q: %w", path, s.Name, err)
		}
		l.Color, sc.Color = plotutil.Color(i), plotutil.Color(i)
		l.Width = vg.Points(1.5)
		sc.Shape = plotutil.Shape(i)
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
	}
	if hline != nil {
		xmin, xmax := p.X.Min, p.X.Max
		ref := plotter.NewFunction(func(float64) float64 { return hline.Y })
		ref.XMin, ref.XMax = xmin, xmax
		ref.Color = color.Gray{Y: 100}
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ref)
		p.Legend.Add(hline.Name, ref)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

// Reference is a horizontal reference line on a chart.
type Reference struct {
	Name string
	Y    float64
}
