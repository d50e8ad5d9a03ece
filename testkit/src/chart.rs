//! A percentile chart (`percentiles.svg`, `record --svg`) read back in its own coordinates, so
//! a test checks what a reader sees: how far apart two curves are drawn at a percentile.

/// One stage's panel: its percentile ticks' x, its latency scale, and its curves.
#[derive(Debug)]
pub struct Panel {
    /// (percentile, x) of each percentile tick.
    pub xticks: Vec<(f64, f64)>,
    /// Pixels per factor of ten of latency, from the first and last latency ticks' own values.
    pub px_per_decade: f64,
    /// (log10 ns, y) of each latency tick.
    pub yticks: Vec<(f64, f64)>,
    /// Each host's bold line (its runs' geometric mean): (host letter, points).
    pub curves: Vec<(String, Vec<(f64, f64)>)>,
    /// Each run's faint line: (host letter, points).
    pub runs: Vec<(String, Vec<(f64, f64)>)>,
}

fn points(text: &str) -> Vec<(f64, f64)> {
    text.split(' ')
        .map(|xy| {
            let (x, y) = xy.split_once(',').expect("x,y");
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// A polyline's y at `x`, interpolated between its points.
pub fn y_at(line: &[(f64, f64)], x: f64) -> f64 {
    let k = line
        .iter()
        .position(|p| p.0 >= x - 1e-9)
        .expect("the line reaches x");
    if k == 0 || (line[k].0 - x).abs() < 1e-9 {
        return line[k].1;
    }
    let (p, q) = (line[k - 1], line[k]);
    p.1 + (q.1 - p.1) * (x - p.0) / (q.0 - p.0)
}

impl Panel {
    /// The panel of `stage` ("app", "device") in a percentile chart.
    pub fn read(svg: &str, stage: &str) -> Panel {
        let doc = roxmltree::Document::parse(svg).expect("the chart is XML");
        let g = doc
            .descendants()
            .find(|n| {
                n.attribute("class") == Some("panel") && n.attribute("data-stage") == Some(stage)
            })
            .unwrap_or_else(|| panic!("no {stage} panel"));
        let number = |n: roxmltree::Node<'_, '_>, a: &str| -> f64 {
            n.attribute(a).unwrap().parse().unwrap()
        };
        let of = |class: &'static str| {
            g.descendants()
                .filter(move |n| n.attribute("class") == Some(class))
        };
        let xticks: Vec<(f64, f64)> = of("xtick")
            .map(|n| (number(n, "data-percentile"), number(n, "x1")))
            .collect();
        let yticks: Vec<(f64, f64)> = of("ytick")
            .map(|n| (number(n, "data-ns").log10(), number(n, "y1")))
            .collect();
        let (first, last) = (yticks[0], yticks[yticks.len() - 1]);
        let lines = |bold: bool| {
            g.descendants()
                .filter(|n| n.has_tag_name("polyline"))
                .filter(|n| (n.attribute("data-run") == Some("all")) == bold)
                .map(|n| {
                    let class = n.attribute("class").unwrap();
                    let host = class.rsplit('-').next().unwrap().to_string();
                    (host, points(n.attribute("points").unwrap()))
                })
                .collect::<Vec<_>>()
        };
        Panel {
            xticks,
            px_per_decade: (first.1 - last.1) / (last.0 - first.0),
            yticks,
            curves: lines(true),
            runs: lines(false),
        }
    }

    /// The x of the tick at `percentile`.
    pub fn x_of(&self, percentile: f64) -> f64 {
        self.xticks
            .iter()
            .find(|t| (t.0 - percentile).abs() < 1e-6)
            .unwrap_or_else(|| panic!("no p{percentile} tick"))
            .1
    }

    /// The bold line of host `host` ("A", "B", or "" on a one-host chart).
    pub fn curve(&self, host: &str) -> &[(f64, f64)] {
        &self
            .curves
            .iter()
            .find(|c| c.0 == host)
            .unwrap_or_else(|| panic!("no curve of host {host:?}"))
            .1
    }

    /// The latency (ns) a curve is drawn at, at `percentile`.
    pub fn drawn_ns(&self, host: &str, percentile: f64) -> f64 {
        let y = y_at(self.curve(host), self.x_of(percentile));
        let (log_ns, tick_y) = self.yticks[0];
        10f64.powf(log_ns + (tick_y - y) / self.px_per_decade)
    }

    /// B's latency over A's at `percentile`, as drawn.
    pub fn drawn_ratio(&self, percentile: f64) -> f64 {
        self.drawn_ns("B", percentile) / self.drawn_ns("A", percentile)
    }
}
