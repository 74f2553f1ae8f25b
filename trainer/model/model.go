package model

import (
	"errors"
	"fmt"

	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/profile"
)

// Model runs the forward and backward passes of one micro-batch. It owns the activation and
// scratch buffers for microBatch sequences, not the parameters: Forward and Backward take the
// flat parameter and gradient buffers laid out by NewLayout. A Model is not safe for
// concurrent use; use one per goroutine. With activation checkpointing (see
// WithActivationCheckpointing) it keeps the activations of one block at a time.
//
// Architecture (GPT-2, pre-LN): x = wte[token] + wpe[position]; per block
// x += attn(ln_1(x)); x += mlp(ln_2(x)); then logits = ln_f(x)·wteᵀ (the output projection is
// tied to the token embedding) and the loss is the mean softmax cross-entropy of each next
// byte.
type Model struct {
	cfg    Config
	layout Layout
	units  []Unit // layout.units, blocks split into parts or not (see Units)
	// split says each block is four units, its parts, rather than one. partIn is where each
	// part of a block lies in its unit's elements, partShapes where its tensors lie in the
	// part's elements (the same in every block).
	split      bool
	partIn     [partsPerBlock]Unit
	partShapes [partsPerBlock]unitShape
	dm         dims
	eng        *kernels.Engine
	par        pool           // row- and head-parallel work outside the matrix products
	prof       *profile.Timer // nil: no profiling

	inputs, targets []byte
	// xs is the residual stream: xs[0] the embeddings, xs[l+1] the output of block l. Block l's
	// output buffer first gets only its MLP branch; the layer norm that reads it next (block
	// l+1's ln_1, or ln_f) adds the residual in place, so after the forward pass xs[l] is the
	// whole input of block l, which is what activation checkpointing recomputes from.
	xs        [][]float32
	blocks    []blockActs // one per block; with checkpointing one that every block shares
	lnf       normActs
	probs     []float32 // [n, v] softmax of the logits
	rowLoss   []float64 // [n] loss of each position
	forwarded bool

	// Activation checkpointing (WithActivationCheckpointing): blocks[0] holds the activations
	// of block held (-1: none).
	checkpointing bool
	held          int

	floats int // fp32 values of every buffer New allocated, for ActivationBytes

	// Scratch.
	qkv     []float32 // [n, 3d]: c_attn output's gradient in backward
	dp      []float32 // [b, h, t, t]
	dx      []float32 // [n, d]: dL/d(residual stream)
	dtmp    []float32 // [n, d]
	d4      []float32 // [n, 4d]
	dlogits []float32 // [n, v]
	part    []float32 // [chunks(n), 4d]: partial sums of reductions over rows (see rowChunk)
	keyBias []float32 // [d]: the key part of c_attn's bias gradient, kept across its backward
}

// normActs is what a layer norm keeps for its backward pass besides its input.
type normActs struct {
	out, mean, rstd []float32
}

// blockActs are the activations of one transformer block kept for the backward pass.
type blockActs struct {
	ln1   normActs
	qkv   []float32 // [n, 3d] c_attn output: q, k and v, each head's columns read in place
	att   []float32 // [b, h, t, t] attention probabilities
	y     []float32 // [n, d] heads merged: input of attn.c_proj
	x2    []float32 // [n, d] residual stream after attention: input of ln_2
	ln2   normActs
	fc    []float32 // [n, 4d] mlp.c_fc output, before GELU
	gelu  []float32 // [n, 4d]
	dgelu []float32 // [n, 4d] GELU's derivative at fc, for the backward pass
}

// New returns a Model for cfg that runs microBatch sequences of cfg.Context+1 bytes per pass,
// with its matrix products on eng; attention heads and row-wise work (layer norm, GELU,
// softmax) are spread over eng.Threads() goroutines, each row on one goroutine in a fixed
// order, and sums over rows in chunks of rowChunk rows, so results do not depend on
// scheduling or on the thread count. It allocates ActivationBytes(cfg, microBatch, opts...)
// bytes of buffers.
// It returns an error when cfg is invalid, microBatch < 1 or eng is nil.
func New(cfg Config, microBatch int, eng *kernels.Engine, opts ...Option) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model: new: %w", err)
	}
	if microBatch < 1 {
		return nil, fmt.Errorf("model: new: micro batch = %d, want >= 1", microBatch)
	}
	if eng == nil {
		return nil, errors.New("model: new: nil kernels engine")
	}
	d, t := cfg.DModel, cfg.Context
	dm := dims{b: microBatch, t: t, d: d, h: cfg.Heads, hd: d / cfg.Heads, v: cfg.Vocab, n: microBatch * t}
	n, bht := dm.n, microBatch*cfg.Heads*t
	floats := 0
	f := func(size int) []float32 {
		floats += size
		return make([]float32, size)
	}
	norm := func() normActs { return normActs{out: f(n * d), mean: f(n), rstd: f(n)} }
	m := &Model{
		cfg:     cfg,
		layout:  NewLayout(cfg),
		dm:      dm,
		eng:     eng,
		par:     pool{threads: eng.Threads(), team: eng, eng: eng.WithThreads(1)},
		inputs:  make([]byte, n),
		targets: make([]byte, n),
		lnf:     norm(),
		probs:   f(n * cfg.Vocab),
		rowLoss: make([]float64, n),
		qkv:     f(n * 3 * d),
		dp:      f(bht * t),
		dx:      f(n * d),
		dtmp:    f(n * d),
		d4:      f(n * 4 * d),
		dlogits: f(n * cfg.Vocab),
		part:    f(chunks(n) * 4 * d),
		keyBias: f(d),
		held:    -1,
	}
	o := collect(opts)
	m.units = m.layout.units(o.splitFrom)
	m.split = m.layout.blockLen() >= o.splitFrom
	start := m.layout.Tensors[2].Offset // block 0's
	for p := range partsPerBlock {
		r := m.layout.partRange(p)
		m.partShapes[p] = m.layout.shapeOf(Unit{Lo: start + r.Lo, Hi: start + r.Hi})
		m.partIn[p] = r
		if m.split {
			m.partIn[p] = Unit{Lo: 0, Hi: r.Len()}
		}
	}
	m.checkpointing = o.checkpointing
	for i := 0; i <= cfg.Layers; i++ {
		m.xs = append(m.xs, f(n*d))
	}
	blocks := cfg.Layers
	if m.checkpointing {
		blocks = 1
	}
	for i := 0; i < blocks; i++ {
		m.blocks = append(m.blocks, blockActs{
			ln1: norm(), qkv: f(n * 3 * d), att: f(bht * t),
			y: f(n * d), x2: f(n * d), ln2: norm(), fc: f(n * 4 * d), gelu: f(n * 4 * d), dgelu: f(n * 4 * d),
		})
	}
	m.floats = floats
	return m, nil
}

// ActivationBytes is the memory New allocates for cfg, microBatch and opts, in bytes: the
// activations kept for the backward pass and the backward pass's scratch. With n =
// microBatch·Context tokens, d = DModel, V = Vocab, L = Layers and a·n·t the attention
// probabilities (Heads·microBatch·Context² values), all fp32:
//   - per block: the two layer norms' outputs and row statistics, c_attn's output (q, k and v),
//     the attention probabilities, the heads merged, the residual after attention, c_fc's
//     output, the GELU and its derivative: 19nd + 4n + a·n·t values, for each of the L blocks,
//     or for one with activation checkpointing;
//   - the residual stream, L+1 buffers of nd values: the embeddings and each block's output,
//     which are the blocks' inputs that checkpointing keeps;
//   - once: ln_f's output and statistics, the softmax probabilities, and the backward pass's
//     scratch (c_attn's output gradient, the attention probabilities' gradient, dL/dx and two
//     more, the logits' gradient, the partial sums of chunks of rowChunk rows, the key bias):
//     10nd + 2n + 2nV + a·n·t + 4d·⌈n/64⌉ + d values;
//
// plus n fp64 per-row losses and 2n bytes of input and target tokens. It is 0 for an invalid
// cfg or microBatch < 1.
func ActivationBytes(cfg Config, microBatch int, opts ...Option) int64 {
	if cfg.Validate() != nil || microBatch < 1 {
		return 0
	}
	n, d, v := int64(microBatch*cfg.Context), int64(cfg.DModel), int64(cfg.Vocab)
	ant := int64(cfg.Heads) * n * int64(cfg.Context)
	blocks := int64(cfg.Layers)
	if collect(opts).checkpointing {
		blocks = 1
	}
	perBlock := 19*n*d + 4*n + ant
	residual := int64(cfg.Layers+1) * n * d
	once := 10*n*d + 2*n + 2*n*v + ant + 4*d*int64(chunks(int(n))) + d
	return 4*(blocks*perBlock+residual+once) + 8*n + 2*n
}

// ActivationBytes is the memory this Model's buffers take, in bytes: ActivationBytes of its
// Config, micro batch and options.
func (m *Model) ActivationBytes() int64 {
	return 4*int64(m.floats) + 8*int64(len(m.rowLoss)) + int64(len(m.inputs)+len(m.targets))
}

// Checkpointing says whether the Model recomputes each block's activations in the backward
// pass (WithActivationCheckpointing).
func (m *Model) Checkpointing() bool { return m.checkpointing }

// SetProfile makes Forward and Backward lap t after each operation, so
// that t attributes their time to the phases (GEMM, attention,
// elementwise); nil turns that off.
func (m *Model) SetProfile(t *profile.Timer) { m.prof = t }

// Layout is the parameter layout the model reads.
func (m *Model) Layout() Layout { return m.layout }

// TokensLen is the number of bytes Forward takes: microBatch sequences of Context+1 bytes.
func (m *Model) TokensLen() int { return m.dm.b * (m.dm.t + 1) }

// Forward computes the mean cross-entropy of next-byte prediction over the micro-batch and
// keeps the activations for Backward. tokens holds microBatch sequences of Context+1 bytes
// back to back; each sequence's inputs are its first Context bytes and its targets the last
// Context. Forward reads only params[:Layout().Size]. It panics when params or tokens is
// shorter or longer than that, or when a token is >= Vocab: those are bugs in the caller.
func (m *Model) Forward(params []float32, tokens []byte) float32 {
	if len(params) < m.layout.Size {
		panic(fmt.Sprintf("model: Forward with %d params, layout needs %d", len(params), m.layout.Size))
	}
	loss, err := m.ForwardUnits(flat{m.units, params}, tokens)
	if err != nil {
		panic(err) // flat never fails
	}
	return loss
}

// ForwardUnits is Forward with the parameters taken from w one unit at a time (see Weights
// for the order); it gives the same bits as Forward of a buffer holding the same parameters.
// When w fails it returns that error and Backward may not follow.
func (m *Model) ForwardUnits(w Weights, tokens []byte) (float32, error) {
	m.forwarded = false
	if len(tokens) != m.TokensLen() {
		panic(fmt.Sprintf("model: Forward with %d tokens, want %d (%d sequences of %d)",
			len(tokens), m.TokensLen(), m.dm.b, m.dm.t+1))
	}
	dm := m.dm
	for b := 0; b < dm.b; b++ {
		seq := tokens[b*(dm.t+1) : (b+1)*(dm.t+1)]
		for _, c := range seq {
			if int(c) >= dm.v {
				panic(fmt.Sprintf("model: token %d >= vocab %d", c, dm.v))
			}
		}
		copy(m.inputs[b*dm.t:], seq[:dm.t])
		copy(m.targets[b*dm.t:], seq[1:])
	}
	n, d := dm.n, dm.d
	final := len(m.units) - 1

	emb, err := m.embeddings(w.Unit(0))
	if err != nil {
		return 0, err
	}
	embedForward(m.par, m.xs[0], emb.wte, emb.wpe, m.inputs, dm.t, d)
	m.prof.Lap(profile.Elementwise)
	// A block's output is the residual x2 plus its MLP branch; the branch goes into the output
	// buffer first and the addition of res = x2 is left to the layer norm that reads the
	// output next, which does both in one pass. With checkpointing every block has the same
	// activations, so that layer norm reads the previous block's x2 before this block's
	// attention overwrites it.
	m.held = -1
	var res []float32
	for l := range m.cfg.Layers {
		a := m.acts(l)
		if err := m.blockForward(a, w, l, m.xs[l], res, m.xs[l+1]); err != nil {
			return 0, err
		}
		m.held = l
		res = a.x2
	}
	fin, err := m.final(w.Unit(final))
	if err != nil {
		return 0, err
	}
	last := m.xs[len(m.xs)-1]
	addLayerNorm(m.par, m.lnf, last, res, fin.lnfw, fin.lnfb, n, d)
	m.prof.Lap(profile.Elementwise)
	if emb, err = m.embeddings(w.Unit(0)); err != nil {
		return 0, err
	}
	m.eng.MatMul(m.probs, m.lnf.out, emb.wte, n, dm.v, d, false, true, false) // logits = ln_f(x)·wteᵀ
	m.prof.Lap(profile.GEMM)
	m.forwarded = true
	loss := crossEntropyForward(m.par, m.probs, m.rowLoss, m.targets, n, dm.v)
	m.prof.Lap(profile.Elementwise)
	return loss, nil
}

// blockForward runs block l's forward pass, its weights taken from w part by part, from its
// input in and keeps its activations in a. The residual res, when not nil, is added to in
// first: in holds only the MLP branch of the block before, whose residual is res (see
// ForwardUnits); afterwards in is the whole input. out gets the block's MLP branch; a nil out
// skips the MLP's output projection, which the backward pass does not need: that is the
// recomputation of activation checkpointing, from an in that is whole already. It returns
// w's error.
func (m *Model) blockForward(a *blockActs, w Weights, l int, in, res, out []float32) error {
	dm := m.dm
	n, d := dm.n, dm.d
	// Attention: x2 = in + c_proj(attn(c_attn(ln_1(in)))).
	t, err := m.blockPart(l, attnIn, w.Unit)
	if err != nil {
		return err
	}
	addLayerNorm(m.par, a.ln1, in, res, t[0], t[1], n, d)
	m.prof.Lap(profile.Elementwise)
	linearForward(m.eng, a.qkv, a.ln1.out, t[2], t[3], n, d, 3*d)
	m.prof.Lap(profile.GEMM)
	attentionForward(m.par, a.y, a.att, a.qkv, dm)
	m.prof.Lap(profile.Attention)
	if t, err = m.blockPart(l, attnOut, w.Unit); err != nil {
		return err
	}
	linearForward(m.eng, a.x2, a.y, t[0], t[1], n, d, d)
	m.prof.Lap(profile.GEMM)
	// MLP: out = x2 + c_proj(gelu(c_fc(ln_2(x2)))).
	if t, err = m.blockPart(l, mlpIn, w.Unit); err != nil {
		return err
	}
	addLayerNorm(m.par, a.ln2, a.x2, in, t[0], t[1], n, d)
	m.prof.Lap(profile.Elementwise)
	linearForward(m.eng, a.fc, a.ln2.out, t[2], t[3], n, d, 4*d)
	m.prof.Lap(profile.GEMM)
	geluForward(m.par, a.gelu, a.dgelu, a.fc)
	m.prof.Lap(profile.Elementwise)
	if out != nil {
		if t, err = m.blockPart(l, mlpOut, w.Unit); err != nil {
			return err
		}
		linearForward(m.eng, out, a.gelu, t[0], t[1], n, 4*d, d)
		m.prof.Lap(profile.GEMM)
	}
	return nil
}

// acts is where block l's activations are kept: its own, or with checkpointing the one set
// every block shares.
func (m *Model) acts(l int) *blockActs {
	if m.checkpointing {
		return &m.blocks[0]
	}
	return &m.blocks[l]
}

// Backward adds to grads[:Layout().Size] scale times the gradient of the loss of the last
// Forward with respect to params; params must be the buffer that Forward read. Adding lets a
// caller accumulate micro-batches into one buffer, and scale folds in 1/(micro-batches) and
// the 1/(R*S) of data parallelism. It panics when called before Forward or with a buffer
// shorter than the layout: those are bugs in the caller.
func (m *Model) Backward(params, grads []float32, scale float32) {
	if len(params) < m.layout.Size || len(grads) < m.layout.Size {
		panic(fmt.Sprintf("model: Backward with %d params and %d grads, layout needs %d",
			len(params), len(grads), m.layout.Size))
	}
	if err := m.BackwardUnits(flat{m.units, params}, flat{m.units, grads}, scale); err != nil {
		panic(err) // flat never fails
	}
}

// BackwardUnits is Backward with the parameters taken from w and the gradients added into g,
// one unit at a time (see Weights and Grads for the orders); w must give the parameters the
// last ForwardUnits read. It gives the same bits as Backward. When w or g fails it returns
// that error, and the gradients of the units not yet Done are partial. It panics when called
// before a forward pass that succeeded.
func (m *Model) BackwardUnits(w Weights, g Grads, scale float32) error {
	if !m.forwarded {
		panic("model: Backward before Forward")
	}
	dm := m.dm
	n, d, v := dm.n, dm.d, dm.v
	final := len(m.units) - 1

	// Logits and the tied output projection: logits = xf·wteᵀ, so
	// dxf = dlogits·wte and dwte += dlogitsᵀ·xf.
	crossEntropyBackward(m.par, m.dlogits, m.probs, m.targets, n, v, scale)
	m.prof.Lap(profile.Elementwise)
	emb, err := m.embeddings(w.Unit(0))
	if err != nil {
		return err
	}
	m.eng.MatMul(m.dtmp, m.dlogits, emb.wte, n, d, v, false, false, false)
	gemb, err := m.embeddings(g.Grad(0))
	if err != nil {
		return err
	}
	m.eng.MatMul(gemb.wte, m.dlogits, m.lnf.out, v, d, n, true, false, true)
	m.prof.Lap(profile.GEMM)
	fin, err := m.final(w.Unit(final))
	if err != nil {
		return err
	}
	gfin, err := m.final(g.Grad(final))
	if err != nil {
		return err
	}
	last := m.xs[len(m.xs)-1]
	layerNormBackward(m.par, m.part, m.dx, gfin.lnfw, gfin.lnfb, m.dtmp, last, m.lnf.mean, m.lnf.rstd, fin.lnfw, n, d, true)
	m.prof.Lap(profile.Elementwise)
	if err := g.Done(final); err != nil {
		return err
	}

	// Blocks, last first. On entry to each, dx = dL/d(block output). A residual connection
	// passes dx through unchanged, and each branch adds its own gradient to it.
	for l := m.cfg.Layers - 1; l >= 0; l-- {
		a, in := m.acts(l), m.xs[l]
		if m.checkpointing && m.held != l {
			// Recompute the block's activations from its input, whole since the forward pass:
			// the same operations on the same values as the forward pass, so the same bits.
			// The last block's are still there after the forward pass.
			if err := m.blockForward(a, w, l, in, nil, nil); err != nil {
				return err
			}
			m.held = l
		}
		// MLP branch: dx += d(ln_2 ∘ c_fc ∘ gelu ∘ c_proj)ᵀ dx; afterwards dx = dL/dx2.
		// c_proj's bias gradient is the column sums of dx, which the layer norm backward that
		// wrote dx summed by chunks (see layerNormBackward).
		wt, gt, err := m.blockParts(l, mlpOut, w, g)
		if err != nil {
			return err
		}
		m.linearProducts(m.d4, gt[0], m.dx, a.gelu, wt[0], n, 4*d, d)
		m.par.eng.SumRows(gt[1], dxSums(m.part, n, d), d)
		if m.doneWith(mlpOut) {
			if err := g.Done(m.blockUnit(l, mlpOut)); err != nil {
				return err
			}
		}
		geluBackward(m.par, m.part, m.d4, a.dgelu, n, 4*d) // and c_fc's bias gradient
		if wt, gt, err = m.blockParts(l, mlpIn, w, g); err != nil {
			return err
		}
		m.par.eng.SumRows(gt[3], m.part[:chunks(n)*4*d], 4*d)
		m.prof.Lap(profile.Elementwise)
		m.linearProducts(m.dtmp, gt[2], m.d4, a.ln2.out, wt[2], n, d, 4*d)
		layerNormBackward(m.par, m.part, m.dx, gt[0], gt[1], m.dtmp, a.x2, a.ln2.mean, a.ln2.rstd, wt[0], n, d, false)
		m.prof.Lap(profile.Elementwise)
		if m.doneWith(mlpIn) {
			if err := g.Done(m.blockUnit(l, mlpIn)); err != nil {
				return err
			}
		}
		// Attention branch; afterwards dx = dL/d(block input).
		if wt, gt, err = m.blockParts(l, attnOut, w, g); err != nil {
			return err
		}
		m.linearProducts(m.dtmp, gt[0], m.dx, a.y, wt[0], n, d, d)
		m.par.eng.SumRows(gt[1], dxSums(m.part, n, d), d)
		m.prof.Lap(profile.Elementwise)
		if m.doneWith(attnOut) {
			if err := g.Done(m.blockUnit(l, attnOut)); err != nil {
				return err
			}
		}
		attentionBackward(m.par, m.qkv, m.dp, m.dtmp, a.att, a.qkv, dm)
		m.prof.Lap(profile.Attention)
		if wt, gt, err = m.blockParts(l, attnIn, w, g); err != nil {
			return err
		}
		m.attnInputBackward(gt[2], gt[3], a.ln1.out, wt[2])
		layerNormBackward(m.par, m.part, m.dx, gt[0], gt[1], m.dtmp, in, a.ln1.mean, a.ln1.rstd, wt[0], n, d, false)
		m.prof.Lap(profile.Elementwise)
		if m.doneWith(attnIn) {
			if err := g.Done(m.blockUnit(l, attnIn)); err != nil {
				return err
			}
		}
	}
	if gemb, err = m.embeddings(g.Grad(0)); err != nil {
		return err
	}
	embedBackward(m.par, gemb.wte, gemb.wpe, m.dx, m.inputs, dm.t, d)
	m.prof.Lap(profile.Elementwise)
	return g.Done(0)
}

// attnInputBackward is the backward of c_attn: it takes the gradient of its output in m.qkv
// ([n, 3d]: q, k, v) and its input in, writes dL/din into m.dtmp and adds the gradients of the
// weights into gw and of the bias into gb, except for the key part of the bias, gb[d:2d], whose
// gradient is exactly 0 and is left as it was.
//
// It is exactly 0 in exact arithmetic: a key bias b adds q_i·b to every score of query i, and
// softmax ignores a constant added to a whole row, so the loss does not depend on b. In the
// backward, each row of dS sums to 0 (sum_j P[i,j] (dP[i,j] - sum_k P[i,k] dP[i,k]) = 0), so
// db = sum_j dk_j = sum_i q_i sum_j dS[i,j] = 0. Computed in float32 it is rounding noise
// (~1e-9) whose value depends on the order of the sums, hence on the world size; AdamW divides
// it by its own root mean square and turns it into steps of the learning rate's size, so runs
// on different world sizes would drift apart on those elements. Leaving it at 0 keeps the
// parameter layout (checkpoints and PyTorch's c_attn.bias) and makes the result exact.
func (m *Model) attnInputBackward(gw, gb, in, w []float32) {
	n, d := m.dm.n, m.dm.d
	copy(m.keyBias, gb[d:2*d])
	m.linearBackward(m.dtmp, gw, gb, m.qkv, in, w, n, d, 3*d)
	copy(gb[d:2*d], m.keyBias)
}

// embeddingWeights are the tensors of unit 0.
type embeddingWeights struct{ wte, wpe []float32 }

// finalWeights are the tensors of the last unit.
type finalWeights struct{ lnfw, lnfb []float32 }

// embeddings slices buf, unit 0's elements, into its tensors; it passes err on.
func (m *Model) embeddings(buf []float32, err error) (embeddingWeights, error) {
	if err != nil {
		return embeddingWeights{}, err
	}
	ts := m.layout.unitTensors(m.units[0], m.checkLen(0, buf))
	return embeddingWeights{wte: ts[0], wpe: ts[1]}, nil
}

// final slices buf, the last unit's elements, into its tensors; it passes err on.
func (m *Model) final(buf []float32, err error) (finalWeights, error) {
	if err != nil {
		return finalWeights{}, err
	}
	u := len(m.units) - 1
	ts := m.layout.unitTensors(m.units[u], m.checkLen(u, buf))
	return finalWeights{lnfw: ts[0], lnfb: ts[1]}, nil
}

// Units are the units the passes ask Weights and Grads for, by their index: those of
// Layout.Units (for a Model New made without test options).
func (m *Model) Units() []Unit { return m.units }

// blockUnit is the index in Units of the unit that holds part p of block l.
func (m *Model) blockUnit(l, p int) int {
	if m.split {
		return 1 + l*partsPerBlock + p
	}
	return 1 + l
}

// doneWith says whether the backward pass, after part p of a block, is done with that part's
// unit: the parts go last first, so with p the first part, or when the part before lies in
// another unit.
func (m *Model) doneWith(p int) bool { return p == attnIn || m.split }

// blockPart asks unit (the Unit of a Weights, or the Grad of a Grads) for part p of block l and
// slices it into its tensors, in layout order; it returns unit's error.
func (m *Model) blockPart(l, p int, unit func(int) ([]float32, error)) (partBufs, error) {
	u := m.blockUnit(l, p)
	buf, err := unit(u)
	if err != nil {
		return partBufs{}, err
	}
	in := m.partIn[p]
	return m.partShapes[p].slice(m.checkLen(u, buf)[in.Lo:in.Hi]), nil
}

// blockParts is blockPart for the weights of part p of block l from w, then its gradients from g.
func (m *Model) blockParts(l, p int, w Weights, g Grads) (weights, grads partBufs, err error) {
	if weights, err = m.blockPart(l, p, w.Unit); err != nil {
		return partBufs{}, partBufs{}, err
	}
	if grads, err = m.blockPart(l, p, g.Grad); err != nil {
		return partBufs{}, partBufs{}, err
	}
	return weights, grads, nil
}

// partBufs are the tensors of a block part, in layout order (two or four), as a value: the
// passes ask for parts on their hot path, and this allocates nothing.
type partBufs [4][]float32

// unitShape is where each tensor of a unit lies in the unit's elements.
type unitShape []Unit

// shapeOf is the shape of unit u of l.
func (l Layout) shapeOf(u Unit) unitShape {
	var s unitShape
	for _, t := range l.Tensors {
		if t.Offset >= u.Lo && t.Offset < u.Hi {
			s = append(s, Unit{Lo: t.Offset - u.Lo, Hi: t.Offset - u.Lo + t.Len()})
		}
	}
	return s
}

// slice cuts buf, a block part's elements, into its tensors (at most four).
func (s unitShape) slice(buf []float32) partBufs {
	var out partBufs
	for i, t := range s {
		out[i] = buf[t.Lo:t.Hi:t.Hi]
	}
	return out
}

// checkLen returns buf, unit u's elements; it panics when buf has another length, a bug in the
// Weights or Grads implementation.
func (m *Model) checkLen(u int, buf []float32) []float32 {
	if len(buf) != m.units[u].Len() {
		panic(fmt.Sprintf("model: unit %d has %d elements, got %d", u, m.units[u].Len(), len(buf)))
	}
	return buf
}
