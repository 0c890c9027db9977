//! One run of the packer, in phases: validate the request, place the build and lock it, plan
//! (or resume a plan), keep what an earlier run finished, write the rest (locally or uploading
//! as it goes), and finish as the mode says (publish a whole dataset, write a shard's part
//! file, or publish an append's next snapshot).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use granary_format::{
    chunk_file_name, parse_chunk_file_name, ChunkSummary, FileAttrs, SNAPSHOT_FILE,
};
use granary_store::object::ObjectUrl;
use rayon::prelude::*;

use crate::plan::{self, Plan};
use crate::publish::{publish_dataset, write_snapshot_pending};
use crate::scan;
use crate::shard::PartChunk;
use crate::{
    finished_shard, hex_id, in_dataset, make_plan, output, progress_bar, settings_text, shard,
    shared_key_of, slimmed, spooled_builder, sync_dir, upload, verify_existing, write_chunks,
    write_file_atomic, Build, Existing, Ids, IoAt, LabelMode, Mode, OutputOptions, PackError,
    PackOptions, PackSummary, Place, ShardSpec, Skipped, PART_FILE, PLAN_FILE,
};

/// [`run_kept`], naming the work directory in the error once a plan was saved there: the
/// work is kept, and `--resume` continues it.
pub(crate) fn run(opts: &PackOptions, mode: Mode) -> Result<PackSummary, PackError> {
    let mut kept = None;
    run_kept(opts, mode, &mut kept).map_err(|e| match kept {
        Some(work) if work.join(PLAN_FILE).exists() => PackError::Kept {
            work,
            cause: Box::new(e),
        },
        _ => e,
    })
}

/// What a run has learnt and done so far.
struct Run<'a> {
    opts: &'a PackOptions,
    mode: Mode,
    t0: Instant,
    /// The source, canonical.
    src: PathBuf,
    /// The object store it uploads to, if any.
    dest: Option<&'a ObjectUrl>,
    place: Place,
    /// What the destination held before the run.
    remote_found: Vec<(String, u64)>,
    warnings: Vec<String>,
    skipped: Vec<Skipped>,
}

/// The outcome of a phase: go on, or the run is already complete.
type Next<T> = ControlFlow<Box<PackSummary>, T>;

/// Packs (or appends) as `mode` says; sets `kept` to the work directory once the plan is saved
/// there.
fn run_kept(
    opts: &PackOptions,
    mode: Mode,
    kept: &mut Option<PathBuf>,
) -> Result<PackSummary, PackError> {
    let t0 = Instant::now();
    opts.output.check()?;
    let src = std::fs::canonicalize(&opts.src).at("opening source", &opts.src)?;
    if !src.is_dir() {
        return Err(usage!("{} is not a directory", opts.src.display()));
    }
    let dest = opts.output.destination.as_deref();
    let place = place(opts, &mode)?;
    let mut run = Run {
        opts,
        mode,
        t0,
        src,
        dest,
        place,
        remote_found: Vec::new(),
        warnings: Vec::new(),
        skipped: Vec::new(),
    };
    if let Some(done) = run.check_output()? {
        return Ok(done);
    }
    let work = run.place.work.clone();
    // The build directory is ours alone from here to the rename that publishes it.
    let existed = std::fs::symlink_metadata(&work).is_ok();
    if existed {
        output::check_replaceable(&work, output::Kind::Build)?;
    } else {
        // The output's parent directories too: `-o new/dir/train.granary` just works.
        std::fs::create_dir_all(&work).at("creating", &work)?;
    }
    let _lock = output::DirLock::build(&work, &opts.output.out)?;
    let _dataset_lock = match &run.mode {
        Mode::Append { snap, .. } => {
            let lock = output::DirLock::dataset(&opts.output.out, "append")?;
            // Another command (a deletion, another append) may have published a generation
            // between our read of the snapshot and the lock: extending the one read would
            // drop what it did.
            let path = opts.output.out.join(granary_format::SNAPSHOT_FILE);
            let mut head = [0u8; granary_format::SNAPSHOT_HEADER_LEN];
            let now = std::fs::File::open(&path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
                .map_err(|e| PackError::io("reading", &path, e))
                .and_then(|()| Ok(granary_format::snapshot_key(&head)?));
            if now? != (snap.dataset_id(), snap.content_digest()) {
                return Err(usage!(
                    "{}: another granary command published a new generation while this \
                     append started; run it again",
                    opts.output.out.display()
                ));
            }
            Some(lock)
        }
        _ => None,
    };
    let scan_start = Instant::now();
    let plan = match run.plan_or_resume(existed) {
        Ok(Next::Continue(plan)) => plan,
        Ok(Next::Break(summary)) => return Ok(*summary),
        Err(e) => {
            // Failed before a plan was saved (in the scan, say): a build directory this run
            // made holds nothing to resume and would only block the next run.
            if !existed && std::fs::read_dir(&work).is_ok_and(|mut d| d.next().is_none()) {
                let _ = std::fs::remove_dir(&work);
            }
            return Err(e);
        }
    };
    *kept = Some(work);
    let scan_s = scan_start.elapsed().as_secs_f64();
    run.place.ids.check(plan.chunk_count())?;
    let mut done = run.keep_finished(&plan)?;
    let chunks_resumed = done.len() as u64;
    for s in run.write(&plan, &done)? {
        let c = run
            .place
            .ids
            .index(s.chunk_id, plan.chunk_count())
            .expect("written chunks are the plan's");
        done.insert(c, s);
    }
    run.finish(plan, done, chunks_resumed, scan_s)
}

/// Where the run builds: its work directory and where its chunks go, with their ids.
fn place(opts: &PackOptions, mode: &Mode) -> Result<Place, PackError> {
    let Mode::Append { snap, .. } = mode else {
        return Place::of(&opts.output);
    };
    let base = u32::try_from(snap.chunk_count())
        .map_err(|_| usage!("the dataset has the most chunks the format allows"))?;
    Ok(Place {
        work: opts.output.out.join(".append.partial"),
        chunks: opts.output.out.clone(),
        ids: Ids { base, stride: 1 },
    })
}

impl Run<'_> {
    /// Checks the output: source and output apart, the destination empty or granary's, an
    /// existing dataset replaced only with `--force`. A shard finished by an earlier run is
    /// the run's result.
    fn check_output(&mut self) -> Result<Option<PackSummary>, PackError> {
        let (opts, out, work) = (self.opts, &self.opts.output.out, &self.place.work);
        let local_out = if self.dest.is_some() { work } else { out };
        output::check_disjoint(&self.src, local_out, work)?;
        if !matches!(self.mode, Mode::Append { .. }) {
            self.remote_found = output::claim(&opts.output, &mut self.warnings)?;
        }
        if let Mode::Shard(s) = &self.mode {
            if !opts.output.force {
                if let Some(done) = finished_shard(opts, *s, work, self.t0)? {
                    return Ok(Some(done));
                }
            }
            std::fs::create_dir_all(out).at("creating", out)?;
        }
        Ok(None)
    }

    /// The settings a plan records (a resumed plan must have the same).
    fn settings(&self) -> String {
        let mut settings = settings_text(self.opts, &self.src);
        match &self.mode {
            Mode::Whole => {}
            Mode::Shard(s) => settings.push_str(&format!("shard={s}\n")),
            Mode::Append { snap, .. } => settings.push_str(&format!(
                "append_after_chunk={}\nparent={}\n",
                snap.chunk_count(),
                granary_format::hex16(&snap.content_digest())
            )),
        }
        settings
    }

    /// The plan of an interrupted run in the work directory, if it is to be resumed.
    fn earlier_plan(&mut self, settings: &str) -> Result<Option<Plan>, PackError> {
        let work = &self.place.work;
        if self.opts.output.resume {
            let p = work.join(PLAN_FILE);
            match Plan::load(&p) {
                Some(plan) if plan.settings == settings => Ok(Some(plan)),
                Some(plan) => Err(usage!(
                    "cannot resume: the interrupted pack in {} used other settings{}.\nrecorded:\n{}now:\n{}\
                     rerun with the recorded settings, or with --force to start over",
                    work.display(),
                    if matches!(self.mode, Mode::Append { .. }) {
                        " (or the dataset changed since: another append published a snapshot)"
                    } else {
                        ""
                    },
                    plan.settings,
                    settings
                )),
                None => {
                    self.warnings.push(format!(
                        "{} holds no usable plan (interrupted before the scan finished, or written by another granary version); starting over",
                        work.display()
                    ));
                    Ok(None)
                }
            }
        } else if self.opts.output.force || !work.join(PLAN_FILE).exists() {
            // Without a plan there is nothing to resume (a run stopped before its scan ended,
            // or one killed while it published: the dataset it replaced waits there to be
            // removed): it goes, as `--resume` would start over too.
            output::empty_dir(work)?;
            Ok(None)
        } else {
            Err(usage!(
                "an interrupted pack exists at {}; pass --resume to continue it or --force to start over",
                work.display()
            ))
        }
    }

    /// The run's plan: an interrupted run's (checked against the source as it is now), or a
    /// new one from a scan, saved in the work directory before any chunk is written.
    fn plan_or_resume(&mut self, existed: bool) -> Result<Next<Plan>, PackError> {
        let settings = self.settings();
        let earlier = match existed {
            true => self.earlier_plan(&settings)?,
            false => None,
        };
        // A restarted shard or append first removes the chunks its earlier run left behind.
        if earlier.is_none() && self.place.chunks != self.place.work {
            output::remove_files_where(&self.place.chunks, |name, _| self.place.owns(name))?;
        }
        match earlier {
            Some(p) => self.resume(p).map(Next::Continue),
            None => self.new_plan(settings),
        }
    }

    /// Kept chunks hold the source as it was at the first scan: resuming over a changed source
    /// would mix old and new versions, so look again and refuse if it changed.
    fn resume(&mut self, p: Plan) -> Result<Plan, PackError> {
        let mut found = scan::scan(&self.src, self.opts, "checking the source against the plan")?;
        self.warnings.append(&mut found.warnings);
        self.skipped.append(&mut found.skipped);
        if let Mode::Append {
            snap,
            existing: Existing::Skip,
        } = &self.mode
        {
            found.files.retain(|_, rel| !in_dataset(snap, rel));
        }
        let changes = plan::SourceChanges::between(&p.files, &found.files);
        drop(found);
        if !changes.is_empty() {
            return Err(usage!(
                "cannot resume: the source changed since the interrupted pack scanned it ({changes}); \
                 its plan and the chunks already written describe the old source. Rerun with --force to \
                 pack the source as it is now"
            ));
        }
        Ok(p)
    }

    /// Scans the source and plans the run (classes, labels and the dataset id as the mode
    /// says); an append with nothing new is complete already.
    fn new_plan(&mut self, settings: String) -> Result<Next<Plan>, PackError> {
        let (opts, work) = (self.opts, self.place.work.clone());
        let mut found = scan::scan(&self.src, opts, "scanning")?;
        self.warnings.append(&mut found.warnings);
        self.skipped.append(&mut found.skipped);
        let (classes, labels, dataset_id) = match &self.mode {
            Mode::Whole => (found.classes.clone(), opts.labels, None),
            Mode::Shard(s) => (
                found.classes.clone(),
                opts.labels,
                Some(shard::shared_dataset_id(
                    &shared_key_of(&settings),
                    s.count,
                    found.names,
                    found.names_digest,
                )),
            ),
            Mode::Append { snap, existing } => {
                let (mut in_ds, mut shown) = (0u64, Vec::new());
                found.files.retain(|_, rel| {
                    let old = in_dataset(snap, rel);
                    if old {
                        in_ds += 1;
                        if shown.len() < 5 {
                            shown.push(String::from_utf8_lossy(rel).into_owned());
                        }
                    }
                    !old
                });
                if in_ds > 0 {
                    if *existing == Existing::Refuse {
                        let _ = std::fs::remove_dir_all(&work);
                        return Err(usage!(
                            "{in_ds} of the files to append are in the dataset already (e.g. {}); \
                             pass --skip-existing to append only the others (a sample's bytes never change \
                             in place: to change samples, pack a new dataset)",
                            shown.join(", ")
                        ));
                    }
                    self.warnings.push(format!(
                        "{in_ds} files are in the dataset already: left out (--skip-existing)"
                    ));
                }
                let classes: Vec<Vec<u8>> = (0..snap.class_count() as u32)
                    .map(|l| snap.class_name(l).map(<[u8]>::to_vec))
                    .collect::<Result<_, _>>()?;
                let labels = if classes.is_empty() {
                    LabelMode::None
                } else {
                    LabelMode::ParentDir
                };
                (classes, labels, Some(snap.dataset_id()))
            }
        };
        // A shard may own no files of a small tree (its part still records the directories
        // it owns); a pack needs files.
        let empty_shard = opts.output.shard.is_some() && found.names > 0;
        if found.files.is_empty() && !empty_shard {
            let _ = std::fs::remove_dir_all(&work);
            if let Mode::Append { snap, .. } = &self.mode {
                self.warnings
                    .push("no new files: the dataset is unchanged".into());
                return Ok(Next::Break(Box::new(PackSummary {
                    out: opts.output.out.clone(),
                    dataset_id: hex_id(&snap.dataset_id()),
                    generation: snap.lineage().generation,
                    action: "unchanged",
                    classes: snap.class_count(),
                    elapsed_s: self.t0.elapsed().as_secs_f64(),
                    skipped: std::mem::take(&mut self.skipped),
                    warnings: std::mem::take(&mut self.warnings),
                    ..PackSummary::default()
                })));
            }
            return Err(usage!("no files to pack in {}", opts.src.display()));
        }
        let scanned = (found.files, found.dirs);
        let plan = make_plan(
            opts,
            settings,
            scanned,
            (classes, labels),
            dataset_id,
            &mut self.warnings,
        );
        let plan = plan.inspect_err(|_| {
            // Nothing was written yet: leave no interrupted pack behind.
            let _ = std::fs::remove_dir_all(&work);
        })?;
        plan.save(&work.join(PLAN_FILE))?;
        Ok(Next::Continue(plan))
    }

    /// Every chunk of an earlier run that is complete and verified (and, for an upload, every
    /// chunk it uploaded whose marker is intact and whose object has the marker's size); the
    /// rest is removed.
    fn keep_finished(&mut self, plan: &Plan) -> Result<BTreeMap<usize, ChunkSummary>, PackError> {
        let (place, work) = (&self.place, &self.place.work);
        let mut done: BTreeMap<usize, ChunkSummary> = BTreeMap::new();
        let mut candidates = Vec::new();
        let mut sent = Vec::new();
        let entries = std::fs::read_dir(&place.chunks).at("listing", &place.chunks)?;
        for e in entries {
            let e = e.at("listing", &place.chunks)?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(c) =
                parse_chunk_file_name(&name).and_then(|id| place.ids.index(id, plan.chunk_count()))
            {
                candidates.push(c);
            } else if place.chunks != *work {
                // The dataset directory: other shards' chunks and the published dataset live
                // here.
                continue;
            } else if let Some(id) = name
                .ends_with(".sent")
                .then(|| upload::parse_sent_name(&name))
                .flatten()
                .filter(|&id| self.dest.is_some() && (id as usize) < plan.chunk_count())
            {
                sent.push(id);
            } else if name != PLAN_FILE {
                // Only granary's own files are here (checked when the lock was taken).
                let p = e.path();
                std::fs::remove_file(&p).at("removing stale", &p)?;
            }
        }
        let verified: Vec<(usize, Option<ChunkSummary>)> = candidates
            .par_iter()
            .map(|&c| (c, verify_existing(place, plan, c)))
            .collect();
        for (c, v) in verified {
            if let Some(s) = v {
                done.insert(c, s);
                continue;
            }
            let p = place.chunks.join(chunk_file_name(place.ids.id(c)));
            let shown = p.display();
            self.warnings
                .push(format!("discarding incomplete or damaged chunk {shown}"));
            std::fs::remove_file(&p).at("removing", &p)?;
        }
        for c in sent {
            let stored = self
                .remote_found
                .iter()
                .find(|(n, _)| *n == chunk_file_name(c))
                .map(|(_, size)| *size);
            match upload::read_marker(work, plan, c) {
                Some(s) if stored == Some(s.file_size) && !done.contains_key(&(c as usize)) => {
                    done.insert(c as usize, s);
                }
                _ => {
                    let p = work.join(upload::sent_name(c));
                    self.warnings.push(format!(
                        "chunk {c} was uploaded by the interrupted run but is not intact at {}; packing it again",
                        self.dest.map(|d| d.url().to_string()).unwrap_or_default()
                    ));
                    std::fs::remove_file(&p).at("removing", &p)?;
                }
            }
        }
        for (c, s) in done.iter_mut() {
            // A kept chunk's paths are the plan's, in order, less the files that run skipped.
            let mut kept = s.paths.iter().peekable();
            for &i in plan.chunk_files(*c) {
                let rel = plan.files.path(i as usize);
                if kept.next_if(|p| p[..] == *rel).is_none() {
                    self.skipped.push(Skipped {
                        path: rel.to_vec(),
                        reason: "skipped by the interrupted run".into(),
                    });
                }
            }
            // Only its size and CRC stay in memory, as for written chunks: its entries and
            // paths are read back from its footer (or upload marker) for the snapshot.
            *s = slimmed(s);
        }
        Ok(done)
    }

    /// Writes the chunks the plan has and `done` lacks, with a progress bar; with a
    /// destination, uploads each as soon as it is written (and first the verified local
    /// chunks an interrupted upload left).
    fn write(
        &mut self,
        plan: &Plan,
        done: &BTreeMap<usize, ChunkSummary>,
    ) -> Result<Vec<ChunkSummary>, PackError> {
        let total_bytes: u64 = plan.files.meta.iter().map(|m| m.size).sum();
        let done_bytes: u64 = done.keys().map(|&c| plan.chunk_bytes(c)).sum();
        let pb = progress_bar(
            self.opts.output.progress,
            Some(total_bytes),
            "{spinner} packing [{bar:30}] {bytes}/{total_bytes} {msg} {bytes_per_sec} ETA {eta}",
        );
        pb.set_position(done_bytes);
        let todo: Vec<usize> = (0..plan.chunk_count())
            .filter(|c| !done.contains_key(c))
            .collect();
        // Files in the chunks kept, less those the interrupted run skipped (listed already).
        let kept_files: usize = done.keys().map(|&c| plan.chunk_files(c).len()).sum();
        let mut files_done = kept_files.saturating_sub(self.skipped.len()) as u64;
        let build = Build {
            opts: self.opts,
            src: &self.src,
            place: &self.place,
            plan,
        };
        let work = &self.place.work;
        let skipped = &mut self.skipped;
        // Verified local chunks of an interrupted pack to a destination still have to go up.
        let unsent: Vec<ChunkSummary> = match self.dest {
            Some(_) => done
                .values()
                .filter(|s| work.join(chunk_file_name(s.chunk_id)).is_file())
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let progress = |n: u64| pb.set_message(format!("uploaded {}", indicatif::HumanBytes(n)));
        upload::with_sink(self.dest, work, unsent, &progress, |sink| {
            write_chunks(&build, &todo, &pb, &mut files_done, skipped, sink)
        })
    }

    /// Finishes as the mode says, from every chunk's summary (read back from its footer where
    /// only its size and CRC were kept), and sums the run up.
    fn finish(
        self,
        plan: Plan,
        done: BTreeMap<usize, ChunkSummary>,
        chunks_resumed: u64,
        scan_s: f64,
    ) -> Result<PackSummary, PackError> {
        let summaries: Vec<ChunkSummary> = done.into_values().collect();
        let mut totals = Totals::new(&self.place.chunks, self.dest.is_some(), &summaries);
        // The plan is done with: free it before the snapshot is built (the peak of a pack's
        // memory).
        let (dataset_id, classes) = (plan.dataset_id, plan.classes.clone());
        let shared = shared_key_of(&plan.settings);
        drop(plan);
        let (work, out) = (&self.place.work, &self.opts.output.out);
        let plan_path = work.join(PLAN_FILE);
        let chunks = summaries.len() as u64;
        let (action, generation) = match &self.mode {
            Mode::Append { snap, .. } => {
                // The dataset's chunks, then its directories (which keep their attributes
                // where the appended tree has them too: the order reindex reads them in),
                // then the new chunks. Attributes are all samples' or none.
                let mut builder = spooled_builder(work, dataset_id, classes.clone())?;
                // Deleted samples stay deleted (by the generations that deleted them).
                let deleted = snap.deleted().iter();
                builder.deletions(
                    deleted
                        .map(|&id| (id, snap.deleted_by(id).unwrap_or(0) as u32))
                        .collect(),
                )?;
                // Compacted chunks keep their revisions (the new ones are at 0).
                builder.revisions(snap.revisions().to_vec());
                for c in snap.chunk_summaries()? {
                    builder.push_chunk(&c)?;
                }
                let dirs = snap.dirs()?.into_iter();
                builder
                    .push_dirs(dirs.map(|d| (d.path, d.attrs.unwrap_or(FileAttrs::DIR_DEFAULT))))?;
                for s in summaries {
                    builder.push_chunk(&totals.full(s)?)?;
                }
                let generation = snap.lineage().generation + 1;
                builder.lineage(granary_format::Lineage {
                    generation,
                    parent: snap.content_digest(),
                });
                // The switch: readers that open from now on see the new generation; the old
                // snapshot stays valid for those that have it open (its chunks are all still
                // here). The plan goes just before it: killed between the two, the next
                // append starts over (its chunks past the dataset's are removed); killed
                // after it, the next append finds the new generation and a build directory
                // without a plan, which it clears.
                let (pending, len) = write_snapshot_pending(&out.join(SNAPSHOT_FILE), builder)?;
                granary_store::write::crash_point("remove", &plan_path);
                std::fs::remove_file(&plan_path).at("removing", &plan_path)?;
                pending.publish().at("renaming into place", out)?;
                totals.bytes_out += len;
                granary_store::write::crash_point("remove", work);
                std::fs::remove_dir_all(work).at("removing", work)?;
                sync_dir(out)?;
                ("append", generation)
            }
            Mode::Whole | Mode::Shard(_) => {
                let o = &self.opts.output;
                let end = End::of(o, shared, &self.remote_found);
                let at = (work.as_path(), Some(plan_path.as_path()));
                totals.end((dataset_id, &classes), summaries, at, end)?;
                (if o.shard.is_some() { "shard" } else { "pack" }, 0)
            }
        };
        Ok(PackSummary {
            out: out.clone(),
            dataset_id: hex_id(&dataset_id),
            shard: self.opts.output.shard.map(|s| s.to_string()),
            generation,
            action,
            classes: classes.len() as u64,
            chunks,
            chunks_resumed,
            scan_s,
            skipped: self.skipped,
            warnings: self.warnings,
            ..totals.summary(self.t0.elapsed().as_secs_f64())
        })
    }
}

/// A run's written chunks on their way into its part or snapshot, in id order: each one's full
/// summary is read back from its footer in `dir` (`uploaded`: from its marker there) as it
/// goes by, and its records counted.
#[derive(Default)]
pub(crate) struct Totals {
    dir: PathBuf,
    uploaded: bool,
    files: u64,
    bytes_in: u64,
    bytes_stored: u64,
    pub bytes_out: u64,
    compressed_records: u64,
}

/// How a write of a whole dataset or of a shard's part ends once its chunks are written.
pub(crate) enum End<'a> {
    /// The shard's part file, its completion marker: written last, atomically.
    Part { shard: ShardSpec, key: String },
    /// The build directory, snapshot and all, renamed to `out` (see [`publish_dataset`]).
    Local(&'a Path),
    /// The snapshot uploaded to `dest`, last: the chunks were uploaded as they were written,
    /// and the chunks of an earlier dataset at the prefix that this one does not have (in
    /// `found`, what the prefix held when the write began) are deleted first, so that the
    /// prefix is a dataset only when complete and holds no object the snapshot does not name.
    /// The build directory (the staging directory) is removed afterwards.
    Remote {
        dest: &'a ObjectUrl,
        found: &'a [(String, u64)],
    },
}

impl<'a> End<'a> {
    /// How a write to `o` ends: as a shard's part (`key`: the settings every shard shares), or
    /// as a whole dataset at `o.out` or uploaded to its destination (which held `found`).
    pub(crate) fn of(o: &'a OutputOptions, key: String, found: &'a [(String, u64)]) -> Self {
        match (o.shard, o.destination.as_deref()) {
            (Some(shard), _) => End::Part { shard, key },
            (None, Some(dest)) => End::Remote { dest, found },
            (None, None) => End::Local(&o.out),
        }
    }
}

impl Totals {
    /// The totals of chunks `summaries` in `dir` (`uploaded`: they were), none read back yet.
    pub(crate) fn new(dir: &Path, uploaded: bool, summaries: &[ChunkSummary]) -> Self {
        Totals {
            dir: dir.to_path_buf(),
            uploaded,
            bytes_out: summaries.iter().map(|s| s.file_size).sum(),
            ..Totals::default()
        }
    }

    /// Ends the write of dataset `dataset_id` with class table `classes` whose chunks are
    /// `summaries` (slim, in id order), built in `work`, as `end` says. `plan`, the run's
    /// resume plan, goes after a part is written, or between the snapshot and the rename of
    /// a local build (a kill while the snapshot is built still resumes); an upload's goes
    /// with its staging directory.
    pub(crate) fn end(
        &mut self,
        (dataset_id, classes): ([u8; 16], &[Vec<u8>]),
        summaries: Vec<ChunkSummary>,
        (work, plan): (&Path, Option<&Path>),
        end: End<'_>,
    ) -> Result<(), PackError> {
        let count = summaries.len();
        let remove_plan = || plan.map_or(Ok(()), |p| std::fs::remove_file(p).at("removing", p));
        if let End::Part { shard, key } = end {
            let chunks = summaries.into_iter();
            let chunks = chunks.map(|s| Ok(PartChunk::of(&self.full(s)?)));
            let chunks = chunks.collect::<Result<_, PackError>>()?;
            let classes = classes.to_vec();
            let part = shard::Part {
                shard,
                dataset_id,
                key,
                classes,
                chunks,
            };
            let bytes = part.encode();
            write_file_atomic(&work.join(PART_FILE), &bytes)?;
            self.bytes_out += bytes.len() as u64;
            return remove_plan();
        }
        let mut builder = spooled_builder(work, dataset_id, classes.to_vec())?;
        for s in summaries {
            builder.push_chunk(&self.full(s)?)?;
        }
        let path = work.join(SNAPSHOT_FILE);
        let (pending, len) = write_snapshot_pending(&path, builder)?;
        pending.publish().at("renaming into place", &path)?;
        self.bytes_out += len;
        match end {
            End::Local(out) => {
                remove_plan()?;
                sync_dir(work)?;
                publish_dataset(work, out)
            }
            End::Remote { dest, found } => {
                for (name, _) in found {
                    if parse_chunk_file_name(name).is_some_and(|c| c as usize >= count) {
                        dest.delete(name)?;
                    }
                }
                dest.put_file(SNAPSHOT_FILE, &path, &|_| {})?;
                std::fs::remove_dir_all(work).at("removing", work)
            }
            End::Part { .. } => unreachable!("ended above"),
        }
    }

    /// The full summary of written chunk `slim`, counted.
    pub(crate) fn full(&mut self, slim: ChunkSummary) -> Result<ChunkSummary, PackError> {
        let s = match self.uploaded {
            true => upload::marker_summary(&self.dir, slim)?,
            false => crate::read_footer(&self.dir, slim)?,
        };
        self.files += s.entries.len() as u64;
        for e in &s.entries {
            self.bytes_stored += e.stored_len;
            self.bytes_in += e.orig_len;
            self.compressed_records +=
                (e.flags & granary_format::FLAG_COMPRESSION_MASK != 0) as u64;
        }
        Ok(s)
    }

    /// A summary with these counts and the rates over `elapsed` seconds (the rest default).
    pub(crate) fn summary(&self, elapsed: f64) -> PackSummary {
        PackSummary {
            files: self.files,
            bytes_in: self.bytes_in,
            bytes_stored: self.bytes_stored,
            bytes_out: self.bytes_out,
            ratio: if self.bytes_out > 0 {
                self.bytes_in as f64 / self.bytes_out as f64
            } else {
                0.0
            },
            compressed_records: self.compressed_records,
            elapsed_s: elapsed,
            files_per_s: self.files as f64 / elapsed.max(1e-9),
            mb_per_s: self.bytes_in as f64 / 1e6 / elapsed.max(1e-9),
            ..PackSummary::default()
        }
    }
}
