//! The command line: `-t` checks a configuration, errors name the file,
//! line, column and field.

use std::process::Command;

fn shardgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .args(args)
        .output()
        .expect("run shardgate")
}

#[test]
fn check_mode_accepts_the_examples() {
    for conf in ["conf/shardgate.yaml", "conf/quickstart.yaml"] {
        let path = format!("{}/{conf}", env!("CARGO_MANIFEST_DIR"));
        let out = shardgate(&["-t", "-c", &path]);
        assert!(
            out.status.success(),
            "{conf}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn check_mode_refuses_a_broken_file_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - id: a\n    url: http://127.0.0.1:1\n    weight: -2\ndomains: {}\n",
    )
    .unwrap();
    let p = path.display().to_string();
    let out = shardgate(&["-t", "-c", &p]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("error: {p}:5:13: shards[0].weight: ")),
        "{stderr}"
    );
    // The gateway itself refuses to start on it.
    let out = shardgate(&["-c", &p]);
    assert!(!out.status.success());
}

#[test]
fn a_missing_file_is_an_error() {
    let out = shardgate(&["-t", "-c", "/nonexistent/shardgate.yaml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the file"));
}
