//! SVG figures of an experiment's results (the `plotters` crate, no fonts needed).

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// One series of a [`bars`] figure: its name and a value per group (None: no bar).
#[derive(Debug, Clone)]
pub struct BarSeries {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// A grouped bar chart on a log scale around 1 (bars rise above 1 and fall below it),
/// one group per label, one bar per series that has a positive, finite value there.
pub fn bars(title: &str, y_desc: &str, labels: &[String], series: &[BarSeries]) -> Result<String> {
    let valid = |v: &Option<f64>| v.filter(|f| f.is_finite() && *f > 0.0);
    let values: Vec<f64> = series
        .iter()
        .flat_map(|s| s.values.iter().filter_map(valid))
        .collect();
    let lo = values.iter().copied().fold(1.0, f64::min) / 1.25;
    let hi = values.iter().copied().fold(1.0, f64::max) * 1.25;
    let groups = labels.len().max(1);
    let width = (120 + 150 * groups) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width.max(640), 480)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..groups as f64, (lo..hi).log_scale())
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE)
            .y_desc(y_desc)
            .y_label_formatter(&|v| format!("{v:.2}x"))
            .x_labels(groups * 2 + 1)
            .x_label_formatter(&|x| {
                // Labels at group centres only.
                let centre = x - x.floor();
                if (centre - 0.5).abs() < 1e-6 {
                    labels.get(x.floor() as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_label_style(("sans-serif", 11))
            .draw()
            .map_err(plot_error)?;
        let bar = 0.8 / series.len().max(1) as f64;
        for (s, (line, &colour)) in series.iter().zip(PALETTE.iter().cycle()).enumerate() {
            let rects = line.values.iter().enumerate().filter_map(|(g, v)| {
                let value = valid(v)?;
                let x0 = g as f64 + 0.1 + s as f64 * bar;
                Some(Rectangle::new(
                    [(x0, 1.0), (x0 + bar * 0.9, value)],
                    colour.filled(),
                ))
            });
            chart
                .draw_series(rects)
                .map_err(plot_error)?
                .label(line.name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
                });
        }
        chart
            .draw_series(LineSeries::new(
                [(0.0, 1.0), (groups as f64, 1.0)],
                BLACK.stroke_width(1),
            ))
            .map_err(plot_error)?;
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// One line of a [`lines`] figure: its name and its (x, y) points.
#[derive(Debug, Clone)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Colours of successive lines (matplotlib's first ones).
pub(crate) const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A log-log line chart, a marked polyline per series (points that are not positive
/// and finite are left out).
pub fn lines(title: &str, x_desc: &str, y_desc: &str, series: &[Line]) -> Result<String> {
    let valid = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && x > 0.0 && y > 0.0;
    let points: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied().filter(valid))
        .collect();
    let range = |get: fn(&(f64, f64)) -> f64| {
        let lo = points.iter().map(get).fold(f64::INFINITY, f64::min);
        let hi = points.iter().map(get).fold(0.0, f64::max);
        if lo.is_finite() && hi > 0.0 {
            (lo / 1.5, hi * 1.5)
        } else {
            (1.0, 10.0)
        }
    };
    let (x_lo, x_hi) = range(|p| p.0);
    let (y_lo, y_hi) = range(|p| p.1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(plot_error)?;
        for (line, &colour) in series.iter().zip(PALETTE.iter().cycle()) {
            let points: Vec<(f64, f64)> = line.points.iter().copied().filter(valid).collect();
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .map_err(plot_error)?
                .label(line.name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour));
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, colour.filled())),
                )
                .map_err(plot_error)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// One row of a [`timeline`]: its label, its bars (start and end in seconds, and the
/// lane, i.e. the colour, each ran in) and its marks (a moment in seconds each).
#[derive(Debug, Clone)]
pub struct TimelineRow {
    pub label: String,
    pub bars: Vec<(f64, f64, usize)>,
    pub marks: Vec<f64>,
}

/// A Gantt chart on a linear time axis: a row per [`TimelineRow`] (top to bottom),
/// its bars coloured by lane (named in `lanes`, the legend), its marks as black
/// ticks.
pub fn timeline(title: &str, lanes: &[&str], rows: &[TimelineRow]) -> Result<String> {
    let end = rows
        .iter()
        .flat_map(|r| r.bars.iter().map(|b| b.1).chain(r.marks.iter().copied()))
        .filter(|t| t.is_finite())
        .fold(1.0, f64::max)
        * 1.05;
    let n = rows.len().max(1) as f64;
    let mut svg = String::new();
    {
        let height = (120 + 28 * rows.len()) as u32;
        let root = SVGBackend::with_string(&mut svg, (760, height.max(240))).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(0f64..end, 0f64..n)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("seconds")
            .y_labels(rows.len() * 2 + 1)
            .y_label_formatter(&|y| {
                // Labels at row centres only; row 0 at the top.
                let centre = y - y.floor();
                if (centre - 0.5).abs() < 1e-6 {
                    let k = rows.len().saturating_sub(1 + y.floor() as usize);
                    rows.get(k).map(|r| r.label.clone()).unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_style(("sans-serif", 11))
            .draw()
            .map_err(plot_error)?;
        let y_of = |k: usize| n - 1.0 - k as f64;
        for (lane, (name, &colour)) in lanes.iter().zip(PALETTE.iter().cycle()).enumerate() {
            let rects: Vec<_> = rows
                .iter()
                .enumerate()
                .flat_map(|(k, row)| {
                    row.bars
                        .iter()
                        .filter(move |b| b.2 == lane && b.0.is_finite() && b.1.is_finite())
                        .map(move |b| {
                            let y = y_of(k);
                            Rectangle::new([(b.0, y + 0.15), (b.1, y + 0.85)], colour.filled())
                        })
                })
                .collect();
            chart
                .draw_series(rects)
                .map_err(plot_error)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
                });
        }
        for (k, row) in rows.iter().enumerate() {
            let y = y_of(k);
            chart
                .draw_series(row.marks.iter().filter(|t| t.is_finite()).map(|&t| {
                    PathElement::new([(t, y + 0.05), (t, y + 0.95)], BLACK.stroke_width(2))
                }))
                .map_err(plot_error)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw the figure: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_draws_a_bar_per_segment_and_a_tick_per_mark() {
        let rows = [
            TimelineRow {
                label: "static j0".into(),
                bars: vec![(0.5, 9.0, 0)],
                marks: Vec::new(),
            },
            TimelineRow {
                label: "balanced j3".into(),
                bars: vec![(0.5, 3.0, 1), (3.2, 8.0, 0), (8.0, f64::NAN, 0)],
                marks: vec![3.0],
            },
        ];
        let svg = timeline("t", &["fast", "slow"], &rows).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        let text: String = doc
            .descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect();
        for word in ["static j0", "balanced j3", "fast", "slow"] {
            assert!(text.contains(word), "{word} in {text}");
        }
        // Three valid bars, two legend swatches, the background and the plot area.
        let rects = doc
            .descendants()
            .filter(|n| n.tag_name().name() == "rect")
            .count();
        assert!(rects >= 5, "{rects} rects");
    }

    #[test]
    fn a_line_chart_is_well_formed_svg_with_a_marker_per_valid_point() {
        let series = [
            Line {
                name: "bare metal".into(),
                points: vec![(8.0, 1.0), (1024.0, 2.0), (2048.0, f64::NAN)],
            },
            Line {
                name: "VM".into(),
                points: vec![(8.0, 20.0), (1024.0, 0.0)],
            },
        ];
        let svg = lines("t", "size", "µs", &series).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        let text: String = doc
            .descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect();
        assert!(text.contains("bare metal") && text.contains("VM"), "{text}");
        let circles = doc
            .descendants()
            .filter(|n| n.tag_name().name() == "circle")
            .count();
        assert_eq!(circles, 3, "two valid points, then one");
    }
}
