//! Escaping text for HTML and SVG (XML) and quoting CSV fields.

/// Escapes text for HTML/XML element content and double- or single-quoted attributes.
/// Control characters that XML 1.0 forbids are dropped so the SVG files stay well-formed.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

/// A CSV field (RFC 4180): quoted when it holds a comma, quote, or line break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A CSV line ending in `\n`.
pub fn csv_line<S: AsRef<str>>(fields: impl IntoIterator<Item = S>) -> String {
    let mut line = fields
        .into_iter()
        .map(|f| csv_field(f.as_ref()))
        .collect::<Vec<_>>()
        .join(",");
    line.push('\n');
    line
}

/// A file-name-safe slug: lowercase ASCII letters and digits joined by single dashes, at
/// most 40 characters, "item" if nothing is left.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
        if out.len() >= 40 {
            break;
        }
    }
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "item".to_string()
    } else {
        out.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<script>alert("x&'y')</script>"#),
            "&lt;script&gt;alert(&quot;x&amp;&#39;y&#39;)&lt;/script&gt;"
        );
        assert_eq!(escape("µs p99 ≤ 1 ms"), "µs p99 ≤ 1 ms");
        assert_eq!(escape("a\u{0}b\u{1b}c\nd"), "abc\nd");
    }

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_line(["x", "1,5", ""]), "x,\"1,5\",\n");
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Throughput vs clients (N)"), "throughput-vs-clients-n");
        assert_eq!(slug("  ../../etc/passwd "), "etc-passwd");
        assert_eq!(slug("µ"), "item");
        assert!(slug(&"x".repeat(100)).len() <= 40);
    }
}
