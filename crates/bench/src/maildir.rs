//! A synthetic maildir: Enron-style messages written to a directory, for `--data` tests and
//! experiments that want real-looking documents without the Enron corpus at hand.
//!
//! Messages have realistic headers and bodies of 0.5 to 50 KB (log-uniform, seeded), spread
//! over `<user>/<folder>/<n>.` folders as the Enron maildir has them, every tenth in a
//! `<user>/cur/` folder under a maildir file name. The same `n` and `seed` write the same
//! bytes.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Writes `n` messages under `root` (made if missing); returns each file's path relative to
/// the root, in the order written.
pub fn write_synthetic_maildir(root: &Path, n: usize, seed: u64) -> std::io::Result<Vec<String>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let users = ["allen-p", "bass-e", "kaminski-v"];
    let folders = ["inbox", "sent_items", "all_documents"];
    let words = [
        "gas", "power", "deal", "schedule", "meeting", "contract", "the", "please", "review",
        "attached", "forecast", "trading", "desk", "Houston", "price", "curve",
    ];
    let mut rel = Vec::with_capacity(n);
    for i in 0..n {
        let user = users[i % users.len()];
        let path = if i % 10 == 9 {
            format!("{user}/cur/17000{i:05}.M{i}P42.host:2,S")
        } else {
            format!("{user}/{}/{}.", folders[(i / 3) % folders.len()], i + 1)
        };
        let body_len = (512.0 * (100f64).powf(rng.gen::<f64>())) as usize; // 0.5 .. 50 KB
        let mut body = String::with_capacity(body_len + 80);
        while body.len() < body_len {
            body.push_str(words[rng.gen_range(0..words.len())]);
            body.push(if rng.gen_ratio(1, 12) { '\n' } else { ' ' });
        }
        let msg = format!(
            "Message-ID: <{id}.{i}.JavaMail.evans@thyme>\r\n\
             Date: Mon, {day} May 2001 {h:02}:{m:02}:00 -0700 (PDT)\r\n\
             From: {user}@enron.com\r\n\
             To: {to}@enron.com\r\n\
             Subject: Re: {subject}\r\n\
             Mime-Version: 1.0\r\n\
             Content-Type: text/plain; charset=us-ascii\r\n\
             Content-Transfer-Encoding: 7bit\r\n\
             X-Folder: \\{user}\\{folder}\r\n\
             \r\n{body}",
            id = rng.gen_range(10_000_000u64..99_999_999),
            day = 1 + i % 28,
            h = i % 24,
            m = i % 60,
            to = users[(i + 1) % users.len()],
            subject = words[i % words.len()],
            folder = folders[i % folders.len()],
        );
        let file = root.join(&path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&file, msg)?;
        rel.push(path);
    }
    Ok(rel)
}
