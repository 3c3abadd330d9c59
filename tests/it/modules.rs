//! Module import circles, as etcd checks its package imports: the sources of keel-server,
//! keel-storage, keel-raft and keel-client are parsed with `syn`, and under every module (the
//! crate root included) the child modules must import each other in one direction. Test code
//! is left out. Reads files only; knows nothing of what the modules hold.
//!
//! `a -> b`, for two children of one module, means non-test code somewhere under `a` names an
//! item somewhere under `b`: by a path from `crate`, `super` or `self`, by a child module's
//! name, or through a name an enclosing module imports (`crate::SnapshotFile` names
//! `snapshot` when lib.rs has `pub use snapshot::SnapshotFile`). A `use` tree counts as the
//! paths it spells out, in the file that writes it (`pub use` too); paths inside macro calls
//! are read from their tokens. Modules map to files as rustc maps them: `x.rs` or `x/mod.rs`,
//! or a `#[path]`.
//!
//! One test per crate: `cargo test -p keel-tests --test it modules::keel_raft`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItem, Item, ItemMod, ItemUse, Meta, UseTree};

/// How many imports (a `use` of a `use`, a glob) one path may pass through.
const IMPORT_HOPS_MAX: usize = 16;

#[test]
fn keel_server_modules_have_no_cycle() {
    check_crate("keel-server");
}

#[test]
fn keel_storage_modules_have_no_cycle() {
    check_crate("keel-storage");
}

#[test]
fn keel_raft_modules_have_no_cycle() {
    check_crate("keel-raft");
}

#[test]
fn keel_client_modules_have_no_cycle() {
    check_crate("keel-client");
}

fn check_crate(name: &str) {
    let found = circles(name, &Sources::of_crate(name));
    let report: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        found.is_empty(),
        "{name} has {} module import circle(s):\n{}",
        found.len(),
        report.join("\n")
    );
}

/// The source files of one crate.
struct Sources {
    /// How messages name the folder holding `lib.rs` (`crates/keel-raft/src/`).
    shown_as: String,
    /// Each file's text, by its path in that folder (`client/batch.rs`).
    files: BTreeMap<String, String>,
}

impl Sources {
    fn of_crate(name: &str) -> Sources {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ lies in the workspace");
        let mut files = BTreeMap::new();
        read_folder(
            &workspace.join("crates").join(name).join("src"),
            "",
            &mut files,
        );
        Sources {
            shown_as: format!("crates/{name}/src/"),
            files,
        }
    }
}

fn read_folder(folder: &Path, prefix: &str, files: &mut BTreeMap<String, String>) {
    let entries = std::fs::read_dir(folder).unwrap_or_else(|e| panic!("{folder:?}: {e}"));
    for entry in entries {
        let path = entry.expect("a readable folder entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            read_folder(&path, &format!("{prefix}{name}/"), files);
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            files.insert(format!("{prefix}{name}"), text);
        }
    }
}

/// A module's path from the crate root (empty for the root itself).
type ModulePath = Vec<String>;

/// A strongly connected set of sibling modules: children of `parent` that import each other
/// in a circle.
#[derive(Debug)]
struct Circle {
    krate: String,
    parent: ModulePath,
    /// A closed walk through every member: it starts and ends at the same one.
    walk: Vec<String>,
    /// Every arrow between two members, with what made it.
    arrows: Vec<(String, String, Evidence)>,
}

/// One place that made an arrow: a file and the path written in it.
#[derive(Debug, Clone)]
struct Evidence {
    file: String,
    path: String,
}

impl Circle {
    /// `keel-client: client::batch -> client::write -> client::batch`.
    fn headline(&self) -> String {
        let walk: Vec<String> = self.walk.iter().map(|child| self.name(child)).collect();
        format!("{}: {}", self.krate, walk.join(" -> "))
    }

    fn name(&self, child: &str) -> String {
        let mut path = self.parent.clone();
        path.push(child.to_string());
        path.join("::")
    }
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = match self.parent.is_empty() {
            true => "the crate root".to_string(),
            false => format!("`{}`", self.parent.join("::")),
        };
        writeln!(f, "{}", self.headline())?;
        write!(
            f,
            "    modules under {parent} must import each other in one direction; move the shared \
             type into a leaf module"
        )?;
        for (source, target, evidence) in &self.arrows {
            let (source, target) = (self.name(source), self.name(target));
            write!(
                f,
                "\n    {source} -> {target}: {} names {}",
                evidence.file, evidence.path
            )?;
        }
        Ok(())
    }
}

/// The import circles among sibling modules of crate `krate`, one per strongly connected
/// component, parents in module order.
fn circles(krate: &str, sources: &Sources) -> Vec<Circle> {
    let parsed = Crate::parse(sources);
    let mut circles = Vec::new();
    for (parent, arrows) in parsed.sibling_arrows() {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (source, target) in arrows.keys() {
            graph
                .entry(source.clone())
                .or_default()
                .insert(target.clone());
        }
        for members in components(&graph) {
            if members.len() < 2 {
                continue;
            }
            let inside = |(source, target): &(String, String)| {
                members.contains(source) && members.contains(target)
            };
            circles.push(Circle {
                krate: krate.to_string(),
                parent: parent.clone(),
                walk: closed_walk(&members, &graph),
                arrows: (arrows.iter())
                    .filter(|(pair, _)| inside(pair))
                    .map(|((s, t), evidence)| (s.clone(), t.clone(), evidence.clone()))
                    .collect(),
            });
        }
    }
    circles
}

/// The strongly connected components of `graph` (Tarjan), sorted.
fn components(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    let nodes: BTreeSet<&String> = graph.keys().chain(graph.values().flatten()).collect();
    for node in nodes {
        if !tarjan.index.contains_key(node.as_str()) {
            tarjan.visit(node);
        }
    }
    tarjan.components.sort();
    tarjan.components
}

struct Tarjan<'g> {
    graph: &'g BTreeMap<String, BTreeSet<String>>,
    index: BTreeMap<&'g str, usize>,
    low: BTreeMap<&'g str, usize>,
    /// Nodes visited whose component is not known yet.
    stack: Vec<&'g str>,
    components: Vec<BTreeSet<String>>,
}

impl<'g> Tarjan<'g> {
    fn visit(&mut self, node: &'g str) {
        let index = self.index.len();
        self.index.insert(node, index);
        self.low.insert(node, index);
        self.stack.push(node);
        for next in self.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            let reach = match self.index.get(next) {
                None => {
                    self.visit(next);
                    self.low[next]
                }
                Some(&next_index) if self.stack.contains(&next) => next_index,
                Some(_) => continue,
            };
            let low = self.low[node].min(reach);
            self.low.insert(node, low);
        }
        if self.low[node] == index {
            let at = self
                .stack
                .iter()
                .rposition(|member| *member == node)
                .unwrap();
            let members = self.stack.split_off(at);
            self.components
                .push(members.into_iter().map(str::to_string).collect());
        }
    }
}

/// A walk from the first member through every member and back, each step an arrow of
/// `graph`: always to the nearest member not walked through yet.
fn closed_walk(
    members: &BTreeSet<String>,
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let start = members.first().expect("a circle has members").clone();
    let mut walk = vec![start.clone()];
    let mut left: BTreeSet<&String> = members.iter().filter(|m| **m != start).collect();
    while !left.is_empty() {
        let at = walk.last().unwrap();
        let steps = shortest_path(at, |node| left.contains(node), members, graph);
        for step in &steps {
            left.remove(step);
        }
        walk.extend(steps);
    }
    let back = shortest_path(walk.last().unwrap(), |node| *node == start, members, graph);
    walk.extend(back);
    walk
}

/// The nodes after `from` on a shortest path, inside `members`, to a node that is `wanted`.
fn shortest_path(
    from: &String,
    wanted: impl Fn(&String) -> bool,
    members: &BTreeSet<String>,
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flatten() {
            if next == from || !members.contains(next) || came_from.contains_key(next) {
                continue;
            }
            came_from.insert(next, node);
            if wanted(next) {
                let mut path = vec![next.clone()];
                while let Some(&before) = came_from.get(path.last().unwrap())
                    && before != from
                {
                    path.push(before.clone());
                }
                path.reverse();
                return path;
            }
            queue.push_back(next);
        }
    }
    panic!("members of one strongly connected component reach each other");
}

/// A crate's modules and every path its non-test code writes.
struct Crate {
    modules: BTreeMap<ModulePath, Module>,
    references: Vec<Reference>,
}

#[derive(Default)]
struct Module {
    children: BTreeSet<String>,
    /// Names of the items it defines (functions, types, constants, ..).
    items: BTreeSet<String>,
    /// Names its `use` items bring in (renamed ones by their new name).
    imports: BTreeMap<String, Written>,
    /// Its glob imports (`use x::*`).
    globs: Vec<Written>,
}

/// A path as written in a module, with `crate`, `self` and `super` already applied.
#[derive(Debug, Clone)]
struct Written {
    /// The module the path starts from.
    base: ModulePath,
    segments: Vec<String>,
    /// Starts with a plain name, which names something of this crate only if `base` has a
    /// child, an item or an import of that name.
    bare: bool,
}

/// A path written in a module's non-test code.
struct Reference {
    module: ModulePath,
    path: Written,
    /// Written where only an item can stand (an expression, a type): a path that turns
    /// out to name a module is a local variable that happens to share its name.
    names_item: bool,
    evidence: Evidence,
}

/// Where a module's `mod x;` declarations find their files.
struct Folders {
    /// `x.rs` and `x/mod.rs` are looked for here.
    children: String,
    /// A `#[path]` is relative to this.
    path_attribute: String,
}

impl Crate {
    fn parse(sources: &Sources) -> Crate {
        let mut parsed = Crate {
            modules: BTreeMap::new(),
            references: Vec::new(),
        };
        let root = Folders {
            children: String::new(),
            path_attribute: String::new(),
        };
        parsed.load_file(sources, Vec::new(), "lib.rs", &root);
        parsed
    }

    fn load_file(&mut self, sources: &Sources, module: ModulePath, file: &str, folders: &Folders) {
        let shown = format!("{}{file}", sources.shown_as);
        let text = (sources.files.get(file)).unwrap_or_else(|| panic!("{shown} is missing"));
        let parsed =
            syn::parse_file(text).unwrap_or_else(|e| panic!("{shown} does not parse: {e}"));
        self.load_items(sources, module, file, folders, &parsed.items);
    }

    fn load_items(
        &mut self,
        sources: &Sources,
        module: ModulePath,
        file: &str,
        folders: &Folders,
        items: &[Item],
    ) {
        let shown = format!("{}{file}", sources.shown_as);
        self.modules.insert(module.clone(), Module::default());
        for item in items {
            if is_test(item_attributes(item)) {
                continue;
            }
            match item {
                Item::Mod(declared) => self.load_child(sources, &module, file, folders, declared),
                Item::Use(used) => self.load_use(&module, &shown, used),
                _ => {
                    if let Some(name) = item_name(item) {
                        self.module(&module).items.insert(name);
                    }
                    let mut collector = Collector {
                        references: &mut self.references,
                        module: &module,
                        file: &shown,
                    };
                    collector.visit_item(item);
                }
            }
        }
    }

    /// Loads the module `declared` in `parent`, unless it is test code.
    fn load_child(
        &mut self,
        sources: &Sources,
        parent: &ModulePath,
        file: &str,
        folders: &Folders,
        declared: &ItemMod,
    ) {
        let name = declared.ident.to_string();
        let mut module = parent.clone();
        module.push(name.clone());
        if let Some((_, items)) = &declared.content {
            self.module(parent).children.insert(name.clone());
            let inner = join(&folders.children, &name);
            let inner = Folders {
                children: inner.clone(),
                path_attribute: inner,
            };
            self.load_items(sources, module, file, &inner, items);
            return;
        }
        let (child_file, folders) = match path_attribute(&declared.attrs) {
            Some(path) => {
                let child_file = join(&folders.path_attribute, &path);
                let folders = file_folders(&child_file, true);
                (child_file, folders)
            }
            None => {
                let flat = join(&folders.children, &format!("{name}.rs"));
                let nested = join(&folders.children, &format!("{name}/mod.rs"));
                let child_file = match sources.files.contains_key(&flat) {
                    true => flat,
                    false => nested,
                };
                let mod_rs = child_file == "mod.rs" || child_file.ends_with("/mod.rs");
                let folders = file_folders(&child_file, mod_rs);
                (child_file, folders)
            }
        };
        if is_test_file(&child_file) {
            return;
        }
        self.module(parent).children.insert(name);
        self.load_file(sources, module, &child_file, &folders);
    }

    /// A module-level `use`: the names it brings in, and the paths it writes.
    fn load_use(&mut self, module: &ModulePath, shown: &str, used: &ItemUse) {
        if used.leading_colon.is_some() {
            return;
        }
        let mut leaves = Vec::new();
        use_leaves(&used.tree, Vec::new(), &mut leaves);
        for leaf in leaves {
            let written = written(module, &leaf.segments);
            match &leaf.imported {
                Imported::Name(name) => {
                    let imports = &mut self.module(module).imports;
                    imports.insert(name.clone(), written.clone());
                }
                Imported::Glob => self.module(module).globs.push(written.clone()),
                Imported::Nothing => {}
            }
            self.references.push(Reference {
                module: module.clone(),
                path: written,
                names_item: false,
                evidence: Evidence {
                    file: shown.to_string(),
                    path: leaf.text(),
                },
            });
        }
    }

    fn module(&mut self, module: &ModulePath) -> &mut Module {
        self.modules.get_mut(module).expect("a loaded module")
    }

    /// Each parent's arrows between its children, each with the first place that made it.
    fn sibling_arrows(&self) -> BTreeMap<ModulePath, BTreeMap<(String, String), Evidence>> {
        let mut arrows: BTreeMap<ModulePath, BTreeMap<(String, String), Evidence>> =
            BTreeMap::new();
        for reference in &self.references {
            let Some((target, names_item)) = self.resolve(&reference.path, 0) else {
                continue;
            };
            if reference.names_item && !names_item {
                continue;
            }
            let source = &reference.module;
            let shared = (source.iter().zip(&target))
                .take_while(|(a, b)| a == b)
                .count();
            if shared == source.len() || shared == target.len() {
                continue;
            }
            let pair = (source[shared].clone(), target[shared].clone());
            let parent = source[..shared].to_vec();
            let evidence = reference.evidence.clone();
            arrows
                .entry(parent)
                .or_default()
                .entry(pair)
                .or_insert(evidence);
        }
        arrows
    }

    /// The module `path` names or names an item of, and whether it names an item; `None` for
    /// a name from outside the crate or a local one.
    fn resolve(&self, path: &Written, hops: usize) -> Option<(ModulePath, bool)> {
        let mut module = path.base.clone();
        for (index, segment) in path.segments.iter().enumerate() {
            let here = &self.modules[&module];
            if here.children.contains(segment) {
                module.push(segment.clone());
                continue;
            }
            if here.items.contains(segment) {
                return Some((module, true));
            }
            if hops < IMPORT_HOPS_MAX
                && let Some(found) = self.resolve_imported(here, &path.segments[index..], hops)
            {
                return Some(found);
            }
            if path.bare && index == 0 {
                return None;
            }
            return Some((module, true));
        }
        Some((module, false))
    }

    /// Resolves `segments` through the imports of `here`: its `use` of the first segment, or
    /// a glob import of a module that has it.
    fn resolve_imported(
        &self,
        here: &Module,
        segments: &[String],
        hops: usize,
    ) -> Option<(ModulePath, bool)> {
        if let Some(import) = here.imports.get(&segments[0]) {
            let mut through = import.clone();
            through.segments.extend_from_slice(&segments[1..]);
            return self.resolve(&through, hops + 1);
        }
        here.globs.iter().find_map(|glob| {
            let (module, false) = self.resolve(glob, hops + 1)? else {
                return None;
            };
            let from_glob = Written {
                base: module,
                segments: segments.to_vec(),
                bare: true,
            };
            self.resolve(&from_glob, hops + 1)
        })
    }
}

/// Collects the paths written in one module's items (not in its child modules).
struct Collector<'a> {
    references: &'a mut Vec<Reference>,
    module: &'a ModulePath,
    file: &'a str,
}

impl Collector<'_> {
    fn note(&mut self, segments: Vec<String>, names_item: bool, text: String) {
        self.references.push(Reference {
            module: self.module.clone(),
            path: written(self.module, &segments),
            names_item,
            evidence: Evidence {
                file: self.file.to_string(),
                path: text,
            },
        });
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        if is_test(item_attributes(item)) {
            return;
        }
        if let Item::Mod(declared) = item {
            panic!(
                "{}: module {} is inside a function body, which this checker does not follow",
                self.file, declared.ident
            );
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let attributes = match item {
            ImplItem::Const(item) => &item.attrs[..],
            ImplItem::Fn(item) => &item.attrs,
            ImplItem::Type(item) => &item.attrs,
            ImplItem::Macro(item) => &item.attrs,
            _ => &[],
        };
        if !is_test(attributes) {
            visit::visit_impl_item(self, item);
        }
    }

    /// A `use` in a block: its paths count, its names are the block's, not the module's.
    fn visit_item_use(&mut self, used: &'ast ItemUse) {
        if used.leading_colon.is_some() {
            return;
        }
        let mut leaves = Vec::new();
        use_leaves(&used.tree, Vec::new(), &mut leaves);
        for leaf in leaves {
            let text = leaf.text();
            self.note(leaf.segments, false, text);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = (path.segments.iter())
                .map(|segment| segment.ident.to_string())
                .collect();
            let text = segments.join("::");
            self.note(segments, true, text);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        let mut paths = Vec::new();
        token_paths(mac.tokens.clone(), &mut paths);
        for segments in paths {
            let text = segments.join("::");
            self.note(segments, true, text);
        }
    }

    /// Attributes name derive macros and tools, never this crate's modules.
    fn visit_attribute(&mut self, _: &'ast Attribute) {}

    /// `pub(in crate::x)` limits who sees an item; it does not use `x`.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
}

/// The paths of two or more segments in a macro call's tokens (`crate::x::f`, `$crate::y`).
fn token_paths(tokens: TokenStream, paths: &mut Vec<Vec<String>>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut index = 0;
    while index < trees.len() {
        let ident = match &trees[index] {
            TokenTree::Group(group) => {
                token_paths(group.stream(), paths);
                index += 1;
                continue;
            }
            // Not the middle of a path whose start was not a name (`::std`, `<T>::f`).
            TokenTree::Ident(ident) if index < 2 || !colons(&trees, index - 2) => ident,
            _ => {
                index += 1;
                continue;
            }
        };
        let mut segments = vec![ident.to_string()];
        index += 1;
        while colons(&trees, index)
            && let Some(TokenTree::Ident(next)) = trees.get(index + 2)
        {
            segments.push(next.to_string());
            index += 3;
        }
        if segments.len() > 1 {
            paths.push(segments);
        }
    }
}

/// Whether `trees[index..]` starts with `::`.
fn colons(trees: &[TokenTree], index: usize) -> bool {
    match (trees.get(index), trees.get(index + 1)) {
        (Some(TokenTree::Punct(first)), Some(TokenTree::Punct(second))) => {
            first.as_char() == ':' && first.spacing() == Spacing::Joint && second.as_char() == ':'
        }
        _ => false,
    }
}

/// One path a `use` tree spells out.
struct UseLeaf {
    segments: Vec<String>,
    imported: Imported,
}

enum Imported {
    Name(String),
    Glob,
    /// `use x as _`: a trait brought in for its methods.
    Nothing,
}

impl UseLeaf {
    fn text(&self) -> String {
        let path = self.segments.join("::");
        match self.imported {
            Imported::Glob => format!("{path}::*"),
            _ => path,
        }
    }
}

/// The leaves of `tree` under `prefix`: `crate::{a::X, b::{self, Y}}` spells out
/// `crate::a::X`, `crate::b` and `crate::b::Y`.
fn use_leaves(tree: &UseTree, prefix: Vec<String>, leaves: &mut Vec<UseLeaf>) {
    let leaf = |ident: &syn::Ident, name: Option<String>| {
        let mut segments = prefix.clone();
        if ident != "self" {
            segments.push(ident.to_string());
        }
        let imported = match name.or_else(|| segments.last().cloned()) {
            Some(name) if name != "_" => Imported::Name(name),
            _ => Imported::Nothing,
        };
        UseLeaf { segments, imported }
    };
    match tree {
        UseTree::Path(path) => {
            let mut prefix = prefix.clone();
            prefix.push(path.ident.to_string());
            use_leaves(&path.tree, prefix, leaves);
        }
        UseTree::Name(name) => leaves.push(leaf(&name.ident, None)),
        UseTree::Rename(rename) => {
            leaves.push(leaf(&rename.ident, Some(rename.rename.to_string())));
        }
        UseTree::Glob(_) => leaves.push(UseLeaf {
            segments: prefix.clone(),
            imported: Imported::Glob,
        }),
        UseTree::Group(group) => {
            for tree in &group.items {
                use_leaves(tree, prefix.clone(), leaves);
            }
        }
    }
}

/// `segments` as written in `module`, with a leading `crate`, `self` or `super`s applied.
fn written(module: &ModulePath, segments: &[String]) -> Written {
    let first = segments.first().map(String::as_str);
    if first == Some("crate") || first == Some("$crate") {
        return Written {
            base: Vec::new(),
            segments: segments[1..].to_vec(),
            bare: false,
        };
    }
    let mut base = module.clone();
    let mut rest = segments;
    if first == Some("self") {
        rest = &segments[1..];
    }
    while rest.first().map(String::as_str) == Some("super") {
        base.pop()
            .expect("`super` of the crate root does not compile");
        rest = &rest[1..];
    }
    Written {
        base,
        segments: rest.to_vec(),
        bare: rest.len() == segments.len(),
    }
}

/// Whether `attributes` make their item test code: `#[test]`, or a `cfg` that needs `test`.
fn is_test(attributes: &[Attribute]) -> bool {
    attributes.iter().any(|attribute| {
        attribute.path().is_ident("test")
            || (attribute.path().is_ident("cfg")
                && attribute
                    .parse_args::<Meta>()
                    .is_ok_and(|meta| needs_test(&meta)))
    })
}

/// Whether a `cfg` predicate holds only when compiling tests: `test` or `all(.., test, ..)`.
fn needs_test(predicate: &Meta) -> bool {
    match predicate {
        Meta::Path(path) => path.is_ident("test"),
        Meta::List(list) if list.path.is_ident("all") => list
            .parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated)
            .is_ok_and(|all| all.iter().any(needs_test)),
        _ => false,
    }
}

/// Whether `file` holds tests by its name or folder: `tests.rs`, `x_tests.rs`, `tests/..`.
fn is_test_file(file: &str) -> bool {
    let name = file.rsplit('/').next().unwrap_or(file);
    name == "tests.rs" || name.ends_with("_tests.rs") || file.split('/').any(|p| p == "tests")
}

fn item_attributes(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(item) => &item.attrs,
        Item::Enum(item) => &item.attrs,
        Item::ExternCrate(item) => &item.attrs,
        Item::Fn(item) => &item.attrs,
        Item::ForeignMod(item) => &item.attrs,
        Item::Impl(item) => &item.attrs,
        Item::Macro(item) => &item.attrs,
        Item::Mod(item) => &item.attrs,
        Item::Static(item) => &item.attrs,
        Item::Struct(item) => &item.attrs,
        Item::Trait(item) => &item.attrs,
        Item::TraitAlias(item) => &item.attrs,
        Item::Type(item) => &item.attrs,
        Item::Union(item) => &item.attrs,
        Item::Use(item) => &item.attrs,
        _ => &[],
    }
}

/// The name an item defines in its module's namespace, if any.
fn item_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(item) => &item.ident,
        Item::Enum(item) => &item.ident,
        Item::ExternCrate(item) => item.rename.as_ref().map_or(&item.ident, |(_, name)| name),
        Item::Fn(item) => &item.sig.ident,
        Item::Static(item) => &item.ident,
        Item::Struct(item) => &item.ident,
        Item::Trait(item) => &item.ident,
        Item::TraitAlias(item) => &item.ident,
        Item::Type(item) => &item.ident,
        Item::Union(item) => &item.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The value of a `#[path = ".."]` attribute.
fn path_attribute(attributes: &[Attribute]) -> Option<String> {
    attributes
        .iter()
        .find_map(|attribute| match &attribute.meta {
            Meta::NameValue(pair) if pair.path.is_ident("path") => match &pair.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(value),
                    ..
                }) => Some(value.value()),
                _ => None,
            },
            _ => None,
        })
}

/// Where the `mod x;` declarations of `file` find their files. A mod-rs file (`lib.rs`,
/// `mod.rs`, or one reached by `#[path]`, which rustc treats alike) holds its children in its
/// own folder; `a/b.rs` holds them in `a/b/`. A `#[path]` is relative to the file's folder.
fn file_folders(file: &str, mod_rs: bool) -> Folders {
    let folder = file.rsplit_once('/').map_or("", |(folder, _)| folder);
    let children = match mod_rs {
        true => folder.to_string(),
        false => file.trim_end_matches(".rs").to_string(),
    };
    Folders {
        children,
        path_attribute: folder.to_string(),
    }
}

/// `folder/name`, with `.` and `..` parts applied.
fn join(folder: &str, name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in folder.split('/').chain(name.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// The checker on small crates held in memory.
mod checker {
    use super::*;

    /// The headlines of the circles in a crate `demo` made of `files`.
    fn check(files: &[(&str, &str)], expected: &[&str]) {
        let sources = Sources {
            shown_as: "demo/src/".to_string(),
            files: (files.iter())
                .map(|(name, text)| (name.to_string(), text.to_string()))
                .collect(),
        };
        let found: Vec<String> = circles("demo", &sources)
            .iter()
            .map(Circle::headline)
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn a_planted_cycle_is_found() {
        check(
            &[
                ("lib.rs", "mod a; mod b;"),
                ("a.rs", "use crate::b::B; pub struct A;"),
                ("b.rs", "pub struct B; pub fn f(_: crate::a::A) {}"),
            ],
            &["demo: a -> b -> a"],
        );
    }

    #[test]
    fn modules_in_one_direction_pass() {
        check(
            &[
                ("lib.rs", "mod a; mod b; mod c;"),
                ("a.rs", "use crate::b::B; use crate::c::C;"),
                ("b.rs", "pub struct B(crate::c::C);"),
                ("c.rs", "pub struct C;"),
            ],
            &[],
        );
    }

    #[test]
    fn parent_and_child_naming_each_other_is_no_sibling_cycle() {
        check(
            &[
                ("lib.rs", "mod p; mod q; pub struct Root; use p::P;"),
                ("p.rs", "mod c; pub struct P; use c::C; fn f() { c::g() }"),
                (
                    "p/c.rs",
                    "use super::P; use super::super::Root; pub struct C;",
                ),
                ("q.rs", "fn f(_: super::Root) {}"),
            ],
            &[],
        );
    }

    #[test]
    fn a_bare_child_name_counts_for_the_parent_file_only() {
        check(
            &[
                ("lib.rs", "mod a; mod b; fn f() { a::g(); b::h(); }"),
                ("a.rs", "pub fn g() { let b = 1; drop(b); }"),
                ("b.rs", "pub fn h() { crate::a::g() }"),
            ],
            &[],
        );
    }

    #[test]
    fn test_code_is_skipped() {
        check(
            &[
                (
                    "lib.rs",
                    "mod a; mod b; #[cfg(test)] mod b_tests; #[cfg(test)] #[path = \"x_tests.rs\"] mod x;",
                ),
                (
                    "a.rs",
                    "pub struct A; #[cfg(test)] mod tests { use crate::b::B; } \
                     #[cfg(all(test, unix))] fn f() -> crate::b::B { todo!() } \
                     impl A { #[cfg(test)] fn g() { crate::b::h() } } mod tests;",
                ),
                ("a/tests.rs", "use crate::b::B;"),
                (
                    "b.rs",
                    "pub struct B; pub fn h(_: crate::a::A) {} #[test] fn t() {}",
                ),
                ("b_tests.rs", "use crate::a::A;"),
                ("x_tests.rs", "use crate::a::A;"),
            ],
            &[],
        );
    }

    #[test]
    fn brace_use_trees_resolve() {
        check(
            &[
                ("lib.rs", "mod a; mod b; mod c;"),
                (
                    "a.rs",
                    "use crate::{b::{self, B as Bee}, c::{C}}; pub struct A;",
                ),
                ("b.rs", "use crate::{c::{self}}; pub struct B;"),
                ("c.rs", "use crate::{a::{A}, b::*};"),
            ],
            &["demo: a -> b -> c -> a"],
        );
    }

    #[test]
    fn a_reexport_of_the_root_is_followed() {
        check(
            &[
                ("lib.rs", "mod a; mod b; pub use b::B;"),
                ("a.rs", "pub fn f(_: crate::B) {}"),
                ("b.rs", "pub struct B; pub use crate::a::f;"),
            ],
            &["demo: a -> b -> a"],
        );
    }

    #[test]
    fn paths_in_macro_calls_count() {
        check(
            &[
                ("lib.rs", "mod a; mod b;"),
                ("a.rs", "fn f() { println!(\"{}\", crate::b::NAME); }"),
                (
                    "b.rs",
                    "pub const NAME: &str = \"b\"; fn g() { assert!(super::a::f()) }",
                ),
            ],
            &["demo: a -> b -> a"],
        );
    }

    #[test]
    fn cycles_are_found_in_nested_modules_of_any_file_layout() {
        check(
            &[
                ("lib.rs", "mod p; #[path = \"elsewhere/q_impl.rs\"] mod q;"),
                ("p/mod.rs", "mod x; mod y { pub struct Y(super::x::X); }"),
                ("p/x.rs", "pub struct X; fn f(_: super::y::Y) {}"),
                ("elsewhere/q_impl.rs", "mod inner;"),
                ("elsewhere/inner.rs", "use crate::p::x::X;"),
            ],
            &["demo: p::x -> p::y -> p::x"],
        );
    }

    #[test]
    fn the_message_names_the_rule_and_every_arrow() {
        let sources = Sources {
            shown_as: "demo/src/".to_string(),
            files: BTreeMap::from([
                ("lib.rs".to_string(), "mod client;".to_string()),
                ("client.rs".to_string(), "mod batch; mod write;".to_string()),
                (
                    "client/batch.rs".to_string(),
                    "use super::write::WriteError; pub fn spanning() {}".to_string(),
                ),
                (
                    "client/write.rs".to_string(),
                    "pub enum WriteError {} fn f() { super::batch::spanning() }".to_string(),
                ),
            ]),
        };
        let message: Vec<String> = circles("demo", &sources)
            .iter()
            .map(ToString::to_string)
            .collect();
        let expected = "demo: client::batch -> client::write -> client::batch
    modules under `client` must import each other in one direction; move the shared type into a leaf module
    client::batch -> client::write: demo/src/client/batch.rs names super::write::WriteError
    client::write -> client::batch: demo/src/client/write.rs names super::batch::spanning";
        assert_eq!(message, [expected]);
    }
}
