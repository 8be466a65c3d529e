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

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw the figure: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
