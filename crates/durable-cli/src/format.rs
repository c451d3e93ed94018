//! Text output helpers: tables, times (in UTC, or in a schedule's own time zone), durations.

use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use durable::Millis;

/// The wall clock in epoch milliseconds.
pub(crate) fn now_ms() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

/// `2026-05-01T12:03:04.120Z` (UTC).
pub(crate) fn timestamp(ms: Millis) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, ms % 1000)
}

/// `2026-12-01 09:00 CET`: `ms` as a wall-clock time in the IANA time zone `zone`, with its
/// abbreviation; seconds (and milliseconds) only when not zero. A zone the time-zone database
/// does not know (a schedule written by a newer build?) falls back to [`timestamp`] in UTC.
pub(crate) fn zoned(ms: Millis, zone: &str) -> String {
    use chrono::{DateTime, Timelike, Utc};
    let tz = match zone.parse::<chrono_tz::Tz>() {
        Ok(tz) => tz,
        Err(_) => return timestamp(ms),
    };
    let Some(utc) = i64::try_from(ms).ok().and_then(DateTime::<Utc>::from_timestamp_millis) else {
        return timestamp(ms);
    };
    let local = utc.with_timezone(&tz);
    let pattern = match (local.second(), ms % 1000) {
        (0, 0) => "%Y-%m-%d %H:%M %Z",
        (_, 0) => "%Y-%m-%d %H:%M:%S %Z",
        _ => "%Y-%m-%d %H:%M:%S%.3f %Z",
    };
    local.format(pattern).to_string()
}

/// A schedule interval, compact: `1h`, `1h30m`, `15m`, `2s500ms`, `1d`.
pub(crate) fn interval(ms: Millis) -> String {
    if ms == 0 {
        return "0ms".into();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A duration in milliseconds, short: `850 ms`, `2.4 s`, `3 min 20 s`, `5 h 02 min`, `3 d 4 h`.
pub(crate) fn duration_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, ms % 60_000 / 1000),
        3_600_000..86_400_000 => format!("{} h {:02} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
        _ => format!("{} d {} h", ms / 86_400_000, ms % 86_400_000 / 3_600_000),
    }
}

/// How long ago `then` was, relative to `now`: `4 s ago`, `in 2.0 s` for future times.
pub(crate) fn ago(then: Millis, now: Millis) -> String {
    if then > now { format!("in {}", duration_ms(then - now)) } else { format!("{} ago", ago_short(now - then)) }
}

fn ago_short(ms: u64) -> String {
    match ms {
        0..1_000 => "<1 s".to_string(),
        1_000..60_000 => format!("{} s", ms / 1000),
        60_000..3_600_000 => format!("{} min", ms / 60_000),
        3_600_000..86_400_000 => format!("{} h", ms / 3_600_000),
        _ => format!("{} d", ms / 86_400_000),
    }
}

/// Shortens `s` to at most `max` characters, ending with `…` when cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A plain text table: left-aligned columns two spaces apart; the last column is not padded.
#[derive(Debug)]
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(headers: &[&str]) -> Self {
        Table { rows: vec![headers.iter().map(|h| h.to_string()).collect()] }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn write(&self, out: &mut dyn Write, indent: &str) -> io::Result<()> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
            .collect();
        for row in &self.rows {
            let mut line = String::from(indent);
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// The plural ending of a count: `""` for one, `"s"` otherwise.
pub(crate) fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_iso() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_767_225_600_123), "2026-01-01T00:00:00.123Z");
        assert_eq!(timestamp(951_825_600_000), "2000-02-29T12:00:00.000Z");
    }

    #[test]
    fn zoned_times_are_wall_clock_times_with_the_zone_abbreviation() {
        // 2026-12-01T08:00:00Z is 09:00 in Paris (winter time), 2026-07-01T07:00:00Z too
        // (summer time).
        assert_eq!(zoned(1_796_112_000_000, "Europe/Paris"), "2026-12-01 09:00 CET");
        assert_eq!(zoned(1_782_889_200_000, "Europe/Paris"), "2026-07-01 09:00 CEST");
        assert_eq!(zoned(1_796_112_000_000, "UTC"), "2026-12-01 08:00 UTC");
        assert_eq!(zoned(1_796_112_030_000, "UTC"), "2026-12-01 08:00:30 UTC");
        assert_eq!(zoned(1_796_112_030_250, "UTC"), "2026-12-01 08:00:30.250 UTC");
        assert_eq!(zoned(1_796_112_000_000, "Mars/Olympus"), "2026-12-01T08:00:00.000Z", "an unknown zone: UTC");
    }

    #[test]
    fn intervals_are_compact() {
        assert_eq!(interval(3_600_000), "1h");
        assert_eq!(interval(5_400_000), "1h30m");
        assert_eq!(interval(900_000), "15m");
        assert_eq!(interval(2_500), "2s500ms");
        assert_eq!(interval(86_400_000), "1d");
        assert_eq!(interval(0), "0ms");
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(duration_ms(35), "35 ms");
        assert_eq!(duration_ms(2_400), "2.4 s");
        assert_eq!(duration_ms(200_000), "3 min 20 s");
        assert_eq!(ago(1_000, 6_500), "5 s ago");
        assert_eq!(ago(500, 900), "<1 s ago");
        assert_eq!(ago(9_000, 7_000), "in 2.0 s");
    }

    #[test]
    fn tables_align_and_truncate() {
        let mut t = Table::new(&["ID", "STATUS", "NOTE"]);
        t.row(vec!["a".into(), "completed".into(), "x".into()]);
        t.row(vec!["long-id".into(), "failed".into(), truncate("a very\nlong note", 8)]);
        let mut out = Vec::new();
        t.write(&mut out, "").unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "ID       STATUS     NOTE\na        completed  x\nlong-id  failed     a very …\n");
    }
}
