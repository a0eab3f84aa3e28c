package cost

import (
	"math"
	"sort"
)

// The robust fit behind Calibration: a linear model with at most
// maxTerms non-negative coefficients, fitted to samples by relative error,
// pulled toward a prior (the presets), and made robust to outliers by
// iteratively reweighted least squares.
//
// Each sample is a row: its features x (each divided by its term's scale,
// so that every θ is about 1 under the presets and one ridge weight fits
// every term) and its measured seconds y; the model predicts x·θ. Errors are
// relative (a prefill of 1 s is 10x noisier than one of 0.1 s), so each
// row is weighted by 1/ŷ², ŷ the previous iterate's prediction: the
// estimating equations of a model whose variance grows with the square of
// its mean, which are unbiased for multiplicative noise (weighting by the
// measurement, 1/y², would pull every prediction low by about twice the
// noise's variance).

// maxTerms bounds the model's coefficients: every support of the
// non-negative solve is tried, 2^maxTerms of them.
const maxTerms = 6

type fitRow struct {
	x [maxTerms]float64
	y float64
}

// robustFit is the result of fitRobust.
type robustFit struct {
	theta [maxTerms]float64
	// width is the robust spread (1.4826 × the median absolute deviation)
	// of the relative residuals of the samples the fit kept, widened for
	// the coefficients it estimated: a prediction's typical relative error.
	width float64
	// used counts the samples with a non-zero weight at the end; an
	// outlier has weight zero.
	used int
}

// Tuning constants of the reweighting: Huber's 1.345 and Tukey's
// biweight 4.685 (each 95% efficient on normal errors), in units of the
// residuals' robust spread, which is never taken below minSpread so that
// a handful of samples on an exact curve do not reject everything else.
const (
	huberK      = 1.345
	bisquareC   = 4.685
	minSpread   = 0.01
	plainIters  = 3
	huberIters  = 6
	tukeyIters  = 8
	robustAfter = 2 // robust weights once there are robustAfter × terms samples
)

// pull is what the fit is pulled toward where the samples leave it free:
// each term toward its prior, with weight lambda, except that a term tied
// to another (tied[j] = i, i < j) is pulled toward that term's value
// instead, with the same weight. tied[j] = j (the zero value for j = 0,
// set by newPull for the others) means no tie.
type pull struct {
	prior  [maxTerms]float64
	lambda float64
	tied   [maxTerms]int
}

func newPull(prior [maxTerms]float64, lambda float64) pull {
	p := pull{prior: prior, lambda: lambda}
	for j := range p.tied {
		p.tied[j] = j
	}
	return p
}

// quadratic returns the penalty as θᵀQθ - 2qᵀθ + constant over k terms.
func (p *pull) quadratic(k int) (q [maxTerms][maxTerms]float64, lin [maxTerms]float64) {
	for j := range k {
		if i := p.tied[j]; i != j {
			q[j][j] += p.lambda
			q[i][i] += p.lambda
			q[i][j] -= p.lambda
			q[j][i] -= p.lambda
			continue
		}
		q[j][j] += p.lambda
		lin[j] += p.lambda * p.prior[j]
	}
	return q, lin
}

// fitRobust fits θ ≥ 0 to rows with k terms, minimising
//
//	Σ r_i (y_i - x_i·θ)² / ŷ_i² + the pull's penalty
//
// with ŷ the previous iterate's predictions and robustness weights r from
// Huber, then Tukey's biweight, on the relative residuals (y - ŷ)/ŷ.
// scratch holds 3 × len(rows) floats of working space.
func fitRobust(rows []fitRow, k int, pl *pull, scratch []float64) robustFit {
	n := len(rows)
	rw, w, pred := scratch[:n], scratch[n:2*n], scratch[2*n:3*n]
	for i := range rows {
		rw[i], pred[i] = 1, rows[i].y
	}
	theta := pl.prior
	robust := n >= robustAfter*k
	iters := plainIters
	if robust {
		iters += huberIters + tukeyIters
	}
	spread := math.Inf(1)
	for it := range iters {
		if it >= plainIters {
			if it <= plainIters+huberIters {
				// The biweight keeps the scale of the last Huber fit (as
				// MM-estimation does): re-estimated from its own weights,
				// it can shrink onto a subset of the samples that fits
				// better and reject the rest.
				spread = residualSpread(rows, pred, rw, w)
			}
			for i := range rows {
				r := math.Abs(rows[i].y/pred[i] - 1)
				if it < plainIters+huberIters {
					rw[i] = 1
					if r > huberK*spread {
						rw[i] = huberK * spread / r
					}
				} else {
					u := r / (bisquareC * spread)
					rw[i] = 0
					if u < 1 {
						rw[i] = (1 - u*u) * (1 - u*u)
					}
				}
			}
		}
		for i := range rows {
			w[i] = rw[i] / (pred[i] * pred[i])
		}
		theta = solveNNLS(rows, w, k, pl)
		for i := range rows {
			// A prediction of (almost) nothing would weigh its row without
			// bound: keep it at a thousandth of the measurement at least.
			pred[i] = max(dot(&rows[i].x, &theta), 1e-3*rows[i].y)
		}
	}
	f := robustFit{theta: theta}
	for i := range rows {
		if rw[i] > 0 {
			f.used++
		}
	}
	// The spread of the kept samples, widened by sqrt(n/(n-k)) for the k
	// coefficients fitted from them; with no more samples than terms there
	// is no spread to measure (the caller takes the prior's width).
	if f.used > k {
		for i := range rw {
			if rw[i] > 0 {
				rw[i] = 1
			}
		}
		s := residualSpread(rows, pred, rw, w)
		f.width = s * math.Sqrt(float64(f.used)/float64(f.used-k))
	}
	return f
}

func dot(x, theta *[maxTerms]float64) float64 {
	var s float64
	for j := range maxTerms {
		s += x[j] * theta[j]
	}
	return s
}

// residualSpread is 1.4826 × the median absolute relative residual
// |y/ŷ - 1| of the rows with a non-zero weight (the MAD about zero: a fit's
// residuals centre on zero), at least minSpread. buf is scratch.
func residualSpread(rows []fitRow, pred, rw, buf []float64) float64 {
	buf = buf[:0]
	for i := range rows {
		if rw[i] > 0 {
			buf = append(buf, math.Abs(rows[i].y/pred[i]-1))
		}
	}
	if len(buf) == 0 {
		return minSpread
	}
	sort.Float64s(buf)
	m := buf[len(buf)/2]
	if len(buf)%2 == 0 {
		m = (m + buf[len(buf)/2-1]) / 2
	}
	return max(1.4826*m, minSpread)
}

// solveNNLS minimises Σ w_i (y_i - x_i·θ)² + the pull's penalty over
// θ ≥ 0 with k terms, by solving the ridge normal equations on every
// support and keeping the best feasible solution. k ≤ maxTerms, so that is
// at most 63 solves of a system of at most 6 unknowns.
func solveNNLS(rows []fitRow, w []float64, k int, pl *pull) [maxTerms]float64 {
	g, b, wsum := normalEquations(rows, w, k)
	q, qlin := pl.quadratic(k)
	best, bestObj := pl.prior, math.Inf(1)
	if wsum == 0 {
		return best
	}
	for mask := 1; mask < 1<<k; mask++ {
		var idx [maxTerms]int
		m := 0
		for j := range k {
			if mask&(1<<j) != 0 {
				idx[m] = j
				m++
			}
		}
		// Terms off the support are held at 0: their pull is a constant
		// of the objective, and their columns drop out.
		var a [maxTerms][maxTerms + 1]float64
		for r := range m {
			for c := range m {
				a[r][c] = g[idx[r]][idx[c]] + q[idx[r]][idx[c]]
			}
			a[r][m] = b[idx[r]] + qlin[idx[r]]
		}
		sol, ok := gaussSolve(&a, m)
		if !ok {
			continue
		}
		var theta [maxTerms]float64
		feasible := true
		for r := range m {
			if sol[r] < 0 {
				feasible = false
				break
			}
			theta[idx[r]] = sol[r]
		}
		if !feasible {
			continue
		}
		// Σ w (y - x·θ)² = Σwy² - 2 b·θ + θᵀ G θ: no pass over the rows;
		// the pull adds θᵀ Q θ - 2 q·θ (its constant is the same for
		// every support).
		obj := wsum
		for a := range k {
			obj -= 2 * (b[a] + qlin[a]) * theta[a]
			for c := range k {
				obj += theta[a] * (g[a][c] + q[a][c]) * theta[c]
			}
		}
		if obj < bestObj {
			best, bestObj = theta, obj
		}
	}
	return best
}

// normalEquations returns the weighted least squares' Gram matrix G =
// Σ w x xᵀ and right-hand side b = Σ w y x over k terms, and Σ w y².
func normalEquations(rows []fitRow, w []float64, k int) (g [maxTerms][maxTerms]float64, b [maxTerms]float64, wsum float64) {
	for i := range rows {
		x := &rows[i].x
		wi := w[i]
		if wi == 0 {
			continue
		}
		wsum += wi * rows[i].y * rows[i].y
		for a := range k {
			b[a] += wi * x[a] * rows[i].y
			for c := a; c < k; c++ {
				g[a][c] += wi * x[a] * x[c]
			}
		}
	}
	for a := range k {
		for c := 0; c < a; c++ {
			g[a][c] = g[c][a]
		}
	}
	return g, b, wsum
}

// gaussSolve solves the m×m system in a's first m columns with right-hand
// side in column m, by Gaussian elimination with partial pivoting. It
// reports false for a (numerically) singular system.
func gaussSolve(a *[maxTerms][maxTerms + 1]float64, m int) ([maxTerms]float64, bool) {
	var x [maxTerms]float64
	for col := range m {
		p := col
		for r := col + 1; r < m; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		if math.Abs(a[p][col]) < 1e-12 {
			return x, false
		}
		a[col], a[p] = a[p], a[col]
		for r := col + 1; r < m; r++ {
			f := a[r][col] / a[col][col]
			for c := col; c <= m; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	for r := m - 1; r >= 0; r-- {
		s := a[r][m]
		for c := r + 1; c < m; c++ {
			s -= a[r][c] * x[c]
		}
		x[r] = s / a[r][r]
	}
	return x, true
}
