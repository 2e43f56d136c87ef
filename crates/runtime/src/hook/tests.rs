//! The hook runtime's checks of what a hook hands back: bounds, names, paths, quotas.

use super::*;

#[test]
fn a_hook_may_set_neither_berths_names_nor_the_loaders_whatever_their_case() {
    for name in ["NOMAD_TOKEN", "nomad_alloc_dir", "Berth_Anything"] {
        let refusal = env_refusal(name).unwrap_or_else(|| panic!("{name} was allowed"));
        assert!(
            refusal.ends_with("variables are set by berth; hooks may not set them"),
            "{refusal}"
        );
    }
    let loader = env_refusal("ld_preload").unwrap();
    assert!(loader.starts_with("LD_* variables change how"), "{loader}");
    assert_eq!(env_refusal("APP_TIER"), None);
}

#[test]
fn paths_must_stay_plain_and_relative() {
    assert!(checked_relative("app.conf").is_ok());
    assert!(checked_relative("conf.d/app.conf").is_ok());
    for bad in ["/etc/passwd", "../x", "a/../../x", "./a", "", "a\0b"] {
        assert!(checked_relative(bad).is_err(), "{bad:?}");
    }
    assert!(checked_relative(&"d/".repeat(9).to_string()).is_err());
}

#[test]
fn writes_stay_beneath_the_root_even_through_planted_symlinks() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("target"), root.path().join("file-link"))
        .unwrap();
    write_beneath(root.path(), Path::new("a/b/c.txt"), b"ok").unwrap();
    assert_eq!(std::fs::read(root.path().join("a/b/c.txt")).unwrap(), b"ok");
    let through_dir = write_beneath(root.path(), Path::new("link/x"), b"no").unwrap_err();
    assert!(
        matches!(through_dir, HookFileError::Escapes(ref p) | HookFileError::NotADirectory(ref p) if p == "link/x"),
        "{through_dir}"
    );
    let through_file = write_beneath(root.path(), Path::new("file-link"), b"no").unwrap_err();
    assert!(
        matches!(through_file, HookFileError::Escapes(ref p) if p == "file-link"),
        "{through_file}"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

/// A FIFO the task left where the hook writes: refused at once, never a blocked open
/// (the test would hang).
#[test]
fn a_fifo_in_place_of_the_file_is_refused_without_blocking() {
    use std::os::unix::fs::OpenOptionsExt as _;
    let root = tempfile::tempdir().unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.path().join("conf.txt"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let error = write_beneath(root.path(), Path::new("conf.txt"), b"x").unwrap_err();
    assert!(matches!(error, HookFileError::NotAFile(_)), "{error}");
    // With a reader waiting, the open succeeds and the type check refuses it.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(root.path().join("conf.txt"))
        .unwrap();
    let error = write_beneath(root.path(), Path::new("conf.txt"), b"x").unwrap_err();
    assert!(matches!(error, HookFileError::NotAFile(_)), "{error}");
    drop(reader);
}

mod properties {
    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;
    use wit::berth::hook::types::{File, PrestartResponse};

    /// The bounds [`check_response`] promises for what it lets through.
    fn assert_within_bounds(output: &PrestartOutput) -> Result<(), TestCaseError> {
        prop_assert!(output.env.len() <= Bounds::ENV_VARS);
        for (key, value) in &output.env {
            prop_assert!(!key.is_empty() && key.len() <= Bounds::ENV_KEY_BYTES);
            prop_assert!(!key.contains('=') && !key.contains('\0'));
            prop_assert!(value.len() <= Bounds::ENV_VALUE_BYTES && !value.contains('\0'));
        }
        prop_assert!(output.files.len() <= Bounds::FILES);
        for path in &output.files {
            prop_assert!(path.is_relative());
            prop_assert!(path.components().all(|c| matches!(c, Component::Normal(_))));
            prop_assert!(path.components().count() <= Bounds::PATH_DEPTH);
        }
        prop_assert!(output.events.len() <= Bounds::EVENTS);
        for event in &output.events {
            // The cut note adds at most ~32 characters.
            prop_assert!(event.chars().count() <= Bounds::EVENT_CHARS + 32);
        }
        Ok(())
    }

    /// An environment name no rule refuses, up to the length bound exactly.
    fn allowed_key() -> impl Strategy<Value = String> {
        let tail = Bounds::ENV_KEY_BYTES - "APP_".len();
        prop_oneof![
            "[A-Za-z0-9_]{0,24}".prop_map(|t| format!("APP_{t}")),
            // Short lowercase names may spell a denied one (`ps4` is `PS4`): the checker's
            // own rule keeps those out.
            "[a-z][a-z0-9]{0,12}"
                .prop_filter("a name no rule refuses", |k| env_refusal(k).is_none()),
            Just(format!("APP_{}", "K".repeat(tail))),
        ]
    }

    fn allowed_value() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => "\\PC{0,40}",
            1 => Just("v".repeat(Bounds::ENV_VALUE_BYTES)),
        ]
    }

    /// A path of `depth` plain names (none is `.` or `..`).
    fn plain_path(depth: usize) -> impl Strategy<Value = String> {
        prop::collection::vec("[a-z0-9_-][a-z0-9_.-]{0,10}", 1..=depth)
            .prop_map(|names| names.join("/"))
    }

    /// Files within every bound: at most [`Bounds::FILES`], at most
    /// [`Bounds::PATH_DEPTH`] deep, and together within the default quota's inodes
    /// (so `count × depth` stays at or under 64); now and then one file of exactly
    /// [`Bounds::FILE_BYTES`].
    fn allowed_files() -> impl Strategy<Value = Vec<File>> {
        let quota = WriteQuota::default();
        (1..=Bounds::PATH_DEPTH)
            .prop_flat_map(move |depth| {
                let most = Bounds::FILES.min(quota.inodes as usize / depth);
                (
                    prop::collection::vec(
                        (plain_path(depth), prop::collection::vec(any::<u8>(), 0..32))
                            .prop_map(|(path, contents)| File { path, contents }),
                        0..=most,
                    ),
                    prop::bool::weighted(0.1),
                )
            })
            .prop_map(|(mut files, one_full)| {
                if one_full && let Some(first) = files.first_mut() {
                    first.contents = vec![b'x'; Bounds::FILE_BYTES];
                }
                files
            })
    }

    /// A prestart answer a well-behaved hook could give: every count, length, name
    /// and path within the bounds, some of them exactly at a bound.
    fn allowed_response() -> impl Strategy<Value = PrestartResponse> {
        let env = prop::collection::vec((allowed_key(), allowed_value()), 0..=Bounds::ENV_VARS);
        let events = prop::collection::vec(
            prop_oneof!["\\PC{0,40}", "\\PC{500,600}"],
            0..=Bounds::EVENTS,
        );
        (env, allowed_files(), events).prop_map(|(env, files, events)| PrestartResponse {
            env,
            files,
            events,
        })
    }

    /// What a hook may get wrong, one thing at a time.
    #[derive(Debug, Clone)]
    enum Excess {
        EnvVars(usize),
        DeniedName(String),
        MalformedName(String),
        LongValue(usize),
        NulInValue,
        Files(usize),
        BigFile,
        BadPath(String),
        QuotaBytes,
        QuotaInodes,
        Events(usize),
    }

    impl Excess {
        /// Whether `check_response` should say `TooMuch` (true) or `Denied` (false).
        fn is_too_much(&self) -> bool {
            !matches!(
                self,
                Excess::DeniedName(_) | Excess::MalformedName(_) | Excess::BadPath(_)
            )
        }
    }

    fn excess() -> impl Strategy<Value = Excess> {
        let denied = prop::sample::select(vec![
            "PATH",
            "path",
            "LD_PRELOAD",
            "ld_library_path",
            "BASH_ENV",
            "IFS",
            "GLIBC_TUNABLES",
            "NODE_OPTIONS",
            "_JAVA_OPTIONS",
            "DYLD_INSERT_LIBRARIES",
            "MALLOC_CHECK_",
            "PYTHONPATH",
            "NOMAD_TASK_NAME",
            "BERTH_ALLOC_ID",
        ]);
        let malformed = prop_oneof![
            Just(String::new()),
            Just("1ABC".to_string()),
            Just("A=B".to_string()),
            Just("A\0B".to_string()),
            Just("A-B".to_string()),
            Just("A B".to_string()),
            Just("É".to_string()),
            Just("A".repeat(Bounds::ENV_KEY_BYTES + 1)),
        ];
        let bad_path = prop_oneof![
            Just(String::new()),
            "/[a-z]{1,8}",
            "(\\.\\./){1,3}[a-z]{1,4}",
            "[a-z]{1,4}/\\.\\./\\.\\./[a-z]{1,4}",
            "\\./[a-z]{1,4}",
            "[a-z]{1,4}\\x00[a-z]{1,4}",
            Just(["d"; Bounds::PATH_DEPTH + 1].join("/")),
        ];
        prop_oneof![
            (Bounds::ENV_VARS + 1..Bounds::ENV_VARS + 8).prop_map(Excess::EnvVars),
            denied.prop_map(|n| Excess::DeniedName(n.to_string())),
            malformed.prop_map(Excess::MalformedName),
            (Bounds::ENV_VALUE_BYTES + 1..Bounds::ENV_VALUE_BYTES + 64).prop_map(Excess::LongValue),
            Just(Excess::NulInValue),
            (Bounds::FILES + 1..Bounds::FILES + 4).prop_map(Excess::Files),
            Just(Excess::BigFile),
            bad_path.prop_map(Excess::BadPath),
            Just(Excess::QuotaBytes),
            Just(Excess::QuotaInodes),
            (Bounds::EVENTS + 1..Bounds::EVENTS + 4).prop_map(Excess::Events),
        ]
    }

    fn plain_file(i: usize) -> File {
        File {
            path: format!("f{i}"),
            contents: b"x".to_vec(),
        }
    }

    /// An otherwise allowed response with exactly one thing over a bound.
    fn over_bound_response() -> impl Strategy<Value = (Excess, PrestartResponse)> {
        (allowed_response(), excess(), any::<Index>()).prop_map(|(mut r, excess, at)| {
            // Where in the list the bad item goes: anywhere, not just first or last.
            let insert = |len: usize| at.index(len + 1);
            match &excess {
                Excess::EnvVars(n) => {
                    while r.env.len() < *n {
                        r.env.push((format!("PAD_{}", r.env.len()), String::new()));
                    }
                }
                Excess::DeniedName(name) | Excess::MalformedName(name) => {
                    let i = insert(r.env.len());
                    r.env.truncate(Bounds::ENV_VARS - 1);
                    r.env.insert(i.min(r.env.len()), (name.clone(), "v".into()));
                }
                Excess::LongValue(n) => {
                    let i = insert(r.env.len());
                    r.env.truncate(Bounds::ENV_VARS - 1);
                    r.env
                        .insert(i.min(r.env.len()), ("APP_LONG".into(), "v".repeat(*n)));
                }
                Excess::NulInValue => {
                    let i = insert(r.env.len());
                    r.env.truncate(Bounds::ENV_VARS - 1);
                    r.env
                        .insert(i.min(r.env.len()), ("APP_NUL".into(), "a\0b".into()));
                }
                Excess::Files(n) => r.files = (0..*n).map(plain_file).collect(),
                Excess::BigFile => {
                    let i = insert(r.files.len());
                    r.files.truncate(Bounds::FILES - 1);
                    r.files.insert(
                        i.min(r.files.len()),
                        File {
                            path: "big".into(),
                            contents: vec![0; Bounds::FILE_BYTES + 1],
                        },
                    );
                }
                Excess::BadPath(path) => {
                    let i = insert(r.files.len());
                    r.files.truncate(Bounds::FILES - 1);
                    r.files.insert(
                        i.min(r.files.len()),
                        File {
                            path: path.clone(),
                            contents: Vec::new(),
                        },
                    );
                }
                Excess::QuotaBytes => {
                    // Each file within FILE_BYTES; together over the 4 MiB quota.
                    let each = Bounds::FILE_BYTES;
                    let n = (WriteQuota::default().bytes as usize).div_ceil(each) + 1;
                    r.files = (0..n)
                        .map(|i| File {
                            path: format!("q{i}"),
                            contents: vec![0; each],
                        })
                        .collect();
                }
                Excess::QuotaInodes => {
                    // Depth within PATH_DEPTH, count within FILES; inodes over 64.
                    r.files = (0..Bounds::FILES)
                        .map(|i| File {
                            path: format!("t{i}/a/b/c/d/e/f/g"),
                            contents: Vec::new(),
                        })
                        .collect();
                }
                Excess::Events(n) => {
                    while r.events.len() < *n {
                        r.events.push("e".into());
                    }
                }
            }
            (excess, r)
        })
    }

    /// Anything at all, mostly malformed: the check must not panic on any of it.
    fn arbitrary_response() -> impl Strategy<Value = PrestartResponse> {
        let text = "\\PC{0,24}|[A-Z_=\\x00./]{0,12}";
        let env = prop::collection::vec((text, text), 0..70);
        let path = "[a-z./]{0,20}|\\PC{0,10}|(\\.\\./)+[a-z]{1,4}|/[a-z]{1,8}";
        let files = prop::collection::vec(
            (path, prop::collection::vec(any::<u8>(), 0..16))
                .prop_map(|(path, contents)| File { path, contents }),
            0..18,
        );
        let events = prop::collection::vec("\\PC{0,600}", 0..10);
        (env, files, events).prop_map(|(env, files, events)| PrestartResponse {
            env,
            files,
            events,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// An answer within every bound is accepted as it is (events clipped), and
        /// the accepted output is within the bounds the check promises. Every case
        /// reaches the bounds assertions.
        #[test]
        fn allowed_output_is_accepted_and_within_bounds(response in allowed_response()) {
            let output = check_response(&response, &WriteQuota::default());
            let output = match output {
                Ok(output) => output,
                Err(e) => return Err(TestCaseError::fail(format!("refused: {e}"))),
            };
            assert_within_bounds(&output)?;
            prop_assert_eq!(&output.env, &response.env);
            let paths: Vec<PathBuf> =
                response.files.iter().map(|f| PathBuf::from(&f.path)).collect();
            prop_assert_eq!(&output.files, &paths);
            prop_assert_eq!(output.events.len(), response.events.len());
            for (given, kept) in response.events.iter().zip(&output.events) {
                if given.chars().count() <= Bounds::EVENT_CHARS {
                    prop_assert_eq!(given, kept);
                } else {
                    let head: String = given.chars().take(Bounds::EVENT_CHARS).collect();
                    // The first EVENT_CHARS characters, then the cut note.
                    prop_assert!(kept.starts_with(&format!("{head}…")), "{kept:?}");
                }
            }
        }

        /// An otherwise allowed answer with one thing over a bound (or a name or
        /// path a hook may not use) is refused, as too much or as denied.
        #[test]
        fn over_bound_output_is_refused((excess, response) in over_bound_response()) {
            match check_response(&response, &WriteQuota::default()) {
                Ok(output) => {
                    return Err(TestCaseError::fail(format!(
                        "{excess:?} was accepted: {} env, {} files, {} events",
                        output.env.len(),
                        output.files.len(),
                        output.events.len()
                    )));
                }
                Err(HookFailure::TooMuch(_)) if excess.is_too_much() => {}
                Err(HookFailure::Denied(_)) if !excess.is_too_much() => {}
                Err(other) => {
                    return Err(TestCaseError::fail(format!(
                        "{excess:?} refused the wrong way: {other:?}"
                    )));
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Arbitrary (mostly malformed) answers: the check never panics, and what it
        /// lets through is within bounds. Few of these are accepted; the two
        /// properties above are the ones that reach the bounds on every case.
        #[test]
        fn arbitrary_output_never_panics(response in arbitrary_response()) {
            if let Ok(output) = check_response(&response, &WriteQuota::default()) {
                assert_within_bounds(&output)?;
            }
        }
    }
}
