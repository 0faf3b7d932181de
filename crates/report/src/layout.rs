//! The report directory's layout: which file each plot and table is written to. The page
//! ([`crate::html`]) links to these names and the writer ([`crate::files`]) creates them, so
//! both take them from here.

use crate::escape::slug;
use crate::model::{Item, Report};

/// The file names planned for one item (none for a note).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    pub svg: Option<String>,
    pub csv: Option<String>,
}

/// File names for every item, in reading order.
pub(crate) fn plan(report: &Report) -> Vec<Planned> {
    let (mut plots, mut tables) = (0, 0);
    let mut out = Vec::new();
    for it in report.sections.iter().flat_map(|s| &s.items) {
        out.push(match it {
            Item::LinePlot(_) | Item::Histogram(_) | Item::StackedBars(_) => {
                plots += 1;
                let stem = format!("plot-{plots:02}-{}", slug(it.title()));
                Planned {
                    svg: Some(format!("{stem}.svg")),
                    csv: Some(format!("{stem}.csv")),
                }
            }
            Item::Table(_) => {
                tables += 1;
                Planned {
                    svg: None,
                    csv: Some(format!("table-{tables:02}-{}.csv", slug(it.title()))),
                }
            }
            Item::Note(_) => Planned {
                svg: None,
                csv: None,
            },
        });
    }
    out
}
