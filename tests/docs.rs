//! Docs that cannot rot: every ```yaml block of README.md and docs/ is a
//! configuration `shardgate -t` accepts (a block starting `# fragment`
//! merged into a minimal one, its top-level keys replacing the minimal
//! one's), and every relative link leads to a file that exists
//! (docs/testing.md).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The configuration a fragment is merged into: one line per top-level key.
const MINIMAL: [(&str, &str); 3] = [
    ("listen", "listen: [{ addr: \"127.0.0.1:8080\" }]"),
    (
        "shards",
        "shards: [{ id: a, url: \"http://127.0.0.1:3001\" }]",
    ),
    ("domains", "domains: {}"),
];

/// README.md and every Markdown file under docs/.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The ```yaml blocks of `text`, with the line each starts on.
fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, usize)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut open {
            None if trimmed.starts_with("```yaml") => {
                let indent = line.len() - trimmed.len();
                open = Some((n + 1, String::new(), indent));
            }
            Some((start, body, _)) if trimmed.starts_with("```") => {
                blocks.push((*start, std::mem::take(body)));
                open = None;
            }
            Some((_, body, indent)) => {
                let at = (*indent).min(line.len() - trimmed.len());
                body.push_str(&line[at..]);
                body.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// `block` as a whole configuration: a fragment merged into [`MINIMAL`].
fn whole(block: &str) -> String {
    if !block.starts_with("# fragment") {
        return block.to_string();
    }
    let defines = |key: &str| {
        block.lines().any(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':'))
        })
    };
    let mut config: String = MINIMAL
        .iter()
        .filter(|(key, _)| !defines(key))
        .map(|(_, line)| format!("{line}\n"))
        .collect();
    config.push_str(block);
    config
}

#[test]
fn every_yaml_example_is_a_configuration_shardgate_accepts() {
    let dir = tempfile::tempdir().expect("dir");
    let mut checked = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("read");
        for (line, block) in yaml_blocks(&text) {
            let path = dir.path().join(format!("example-{checked}.yaml"));
            std::fs::write(&path, whole(&block)).expect("write");
            let out = Command::new(env!("CARGO_BIN_EXE_shardgate"))
                .args(["-t", "-c"])
                .arg(&path)
                .output()
                .expect("run shardgate -t");
            if !out.status.success() {
                failures.push(format!(
                    "{}:{line}: {}",
                    doc.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} yaml blocks found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_relative_link_leads_to_a_file() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("read");
        let base = doc.parent().expect("a directory");
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = &rest[..end];
                rest = &rest[end..];
                let path = target.split('#').next().unwrap_or_default();
                let external = target.contains("://") || target.starts_with("mailto:");
                if external || path.is_empty() {
                    continue;
                }
                checked += 1;
                if !base.join(path).exists() {
                    broken.push(format!("{}:{}: {target}", doc.display(), n + 1));
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_fragment_is_merged_into_the_minimal_configuration() {
    let merged = whole("# fragment\nshards: []\nlimits: {}\n");
    assert!(merged.contains("listen:") && merged.contains("domains: {}"));
    assert_eq!(merged.matches("shards:").count(), 1);
    assert_eq!(whole("listen: []\n"), "listen: []\n");
    let blocks = yaml_blocks("a\n```yaml\nx: 1\n```\n  ```yaml\n  y: 2\n  ```\n");
    assert_eq!(blocks, vec![(2, "x: 1\n".into()), (5, "y: 2\n".into())]);
}
