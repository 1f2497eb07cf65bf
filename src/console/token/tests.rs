use super::*;

/// No header is 401-worthy, a wrong or unconfigured token 403-worthy, the right one passes.
#[test]
fn checks_bearer_tokens() {
    let token = AdminToken::fixed("s3cret");
    assert_eq!(token.check(None), Err(Refusal::Missing));
    assert_eq!(token.check(Some(b"Basic s3cret")), Err(Refusal::Missing));
    assert_eq!(token.check(Some(b"Bearer nope")), Err(Refusal::Wrong));
    assert_eq!(token.check(Some(b"Bearer s3cret")), Ok(()));
    assert_eq!(
        AdminToken::none().check(Some(b"Bearer s3cret")),
        Err(Refusal::Wrong)
    );
}

/// A token file is trimmed, reloaded on demand, and an emptied file keeps the old token.
#[test]
fn reloads_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "one\n").unwrap();
    let token = AdminToken::load(&path).unwrap();
    assert_eq!(token.check(Some(b"Bearer one")), Ok(()));
    std::fs::write(&path, "two").unwrap();
    token.reload();
    assert_eq!(token.check(Some(b"Bearer two")), Ok(()));
    std::fs::write(&path, "  ").unwrap();
    token.reload();
    assert_eq!(token.check(Some(b"Bearer two")), Ok(()));
    assert!(format!("{token:?}").find("two").is_none());
}
