package report

import (
	"fmt"
	"image/color"
	"math"

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
	// Room above the bars for the legend.
	top := 0.0
	for _, s := range series {
		for _, v := range s.Values {
			top = math.Max(top, v)
		}
	}
	p.Y.Max = top / (1 - math.Min(0.08*float64(len(series))+0.04, 0.6))
	p.Legend.Top = true
	p.Legend.YOffs = belowTitle(p)
	p.NominalX(categories...)
	p.Add(plotter.NewGrid())
	return p.Save(vg.Length(max(5, 1.4*float64(len(categories))))*vg.Inch, 4*vg.Inch, path)
}

// Line is one series of a line chart.
type Line struct {
	Name string
	X, Y []float64
}

// LineOptions shape a line chart.
type LineOptions struct {
	// Reference, when set, draws a dashed horizontal line at that value.
	Reference *Reference
	// LogX and LogY put an axis on a log scale; their values must be > 0.
	LogX, LogY bool
	// XNames, when set, labels the x values 0, 1, 2, ... with names (days,
	// say) instead of numbers.
	XNames []string
}

// LineChart writes a line chart with points to path (PNG).
func LineChart(path, title, xlabel, ylabel string, series []Line, o LineOptions) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	if o.LogX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if o.LogY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if o.XNames != nil {
		p.NominalX(o.XNames...)
	}
	p.Add(plotter.NewGrid())
	ymax := math.Inf(-1)
	ymin := math.Inf(1)
	for i, s := range series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("chart %s: series %q has %d x and %d y values", path, s.Name, len(s.X), len(s.Y))
		}
		pts := make(plotter.XYs, len(s.X))
		for j := range s.X {
			if (o.LogX && !(s.X[j] > 0)) || (o.LogY && !(s.Y[j] > 0)) {
				return fmt.Errorf("chart %s: series %q: point (%v, %v) on a log axis", path, s.Name, s.X[j], s.Y[j])
			}
			pts[j].X, pts[j].Y = s.X[j], s.Y[j]
			ymax, ymin = math.Max(ymax, s.Y[j]), math.Min(ymin, s.Y[j])
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
	if o.Reference != nil {
		ref := plotter.NewFunction(func(float64) float64 { return o.Reference.Y })
		ref.Color = color.Gray{Y: 100}
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ref)
		p.Legend.Add(o.Reference.Name, ref)
		ymax, ymin = math.Max(ymax, o.Reference.Y), math.Min(ymin, o.Reference.Y)
	}
	// Room above the data for the legend: the top fraction f of the axis,
	// about 7% per legend entry.
	entries := len(series)
	if o.Reference != nil {
		entries++
	}
	f := math.Min(0.08*float64(entries)+0.04, 0.6)
	if o.LogY {
		p.Y.Min = ymin / 2
		p.Y.Max = math.Exp((math.Log(ymax) - f*math.Log(p.Y.Min)) / (1 - f))
	} else {
		p.Y.Min = math.Min(0, ymin)
		p.Y.Max = p.Y.Min + (ymax-p.Y.Min)/(1-f)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.YOffs = belowTitle(p)
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

// Reference is a horizontal reference line on a chart.
type Reference struct {
	Name string
	Y    float64
}

// belowTitle is the legend offset that keeps a top legend clear of the
// title: gonum places it against the top of the whole image.
func belowTitle(p *plot.Plot) vg.Length {
	return -(p.Title.TextStyle.Font.Size*1.5 + p.Title.Padding)
}
