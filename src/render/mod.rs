//! Pure renderers: the human summary (with its probe and kv parts) from a profile, fio-style
//! JSON, the CSV files, the diff as text, Markdown and an HTML page, and the charts (SVG).

pub mod charts;
pub mod csv_export;
pub mod diff_html;
pub mod diff_render;
pub mod host;
pub mod hypervisor_report;
pub mod iotune_report;
pub mod kv_report;
pub mod latency_table;
pub mod probe_report;
pub mod report;
pub mod stalls;
pub mod summary;
