//! The charts, as SVG: latency against percentile on a "nines" axis (`percentiles`), the mean
//! and tail waterfalls and the hypervisor's mechanisms (`waterfalls`). Pure functions of the
//! profiles and the diff; `diff --svg`, `diff --html` and `record --svg` write what they return.
//!
//! Drawn as SVG text directly: plotters needs a font rasterizer (system fonts or an embedded
//! font file) to lay out text even for SVG output, and cannot draw a percentile axis without a
//! custom coordinate type; these charts are lines, rectangles and labels whose text the viewer
//! renders. Every drawn figure carries its value in a `data-` attribute or a `<title>`, so tests
//! read the chart in its own coordinates.

pub mod percentiles;
pub mod waterfalls;

use std::fmt::Write as _;

/// Host A's colour and host B's (and a one-host chart's).
pub const COLOR_A: &str = "#1f77b4";
pub const COLOR_B: &str = "#d62728";

/// The stages' colours in a stacked bar: queue, device, completion, software.
const PART_COLORS: [&str; 4] = ["#9467bd", "#ff7f0e", "#2ca02c", "#8c8c8c"];

/// Text for an SVG or HTML element: markup escaped, and control characters (which XML 1.0
/// cannot hold at all) shown as U+FFFD.
pub fn esc(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect::<String>()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG document being written: its size is fixed when it is finished, so sections can be
/// added before the height is known.
struct Svg {
    width: f64,
    body: String,
}

impl Svg {
    fn new(width: f64) -> Self {
        Self {
            width,
            body: String::new(),
        }
    }

    /// Appends one element (or several) as written.
    fn raw(&mut self, markup: &str) {
        self.body.push_str(markup);
        self.body.push('\n');
    }

    /// A text label at (x, y); `attrs` are extra attributes (`text-anchor="end"`).
    fn text(&mut self, x: f64, y: f64, attrs: &str, text: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}"{}{attrs}>{}</text>"#,
            if attrs.is_empty() { "" } else { " " },
            esc(text)
        );
    }

    /// The header lines every chart opens with: its title, then a legend line per host.
    fn heading(&mut self, title: &str, legend: &[(&str, String)]) -> f64 {
        self.text(20.0, 28.0, r#"font-size="16" font-weight="bold""#, title);
        let mut y = 42.0;
        // About 7 px per character at this size: a long host description wraps.
        let chars = ((self.width - 50.0) / 7.0) as usize;
        for (color, name) in legend {
            let _ = writeln!(
                self.body,
                r#"<rect x="20" y="{y}" width="12" height="12" fill="{color}"/>"#
            );
            // Lines break at spaces only: a date's hyphens are not places to break.
            let at_spaces =
                textwrap::Options::new(chars).word_splitter(textwrap::WordSplitter::NoHyphenation);
            for line in textwrap::wrap(name, at_spaces) {
                self.text(38.0, y + 11.0, "", &line);
                y += 16.0;
            }
            y += 2.0;
        }
        y + 10.0
    }

    fn finish(self, title: &str, height: f64) -> String {
        let (w, h) = (self.width, height.ceil());
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<title>{}</title>
<rect width="100%" height="100%" fill="white"/>
{}</svg>
"#,
            esc(title),
            self.body
        )
    }
}

#[cfg(test)]
mod tests;
