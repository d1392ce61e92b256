package dev.tandem.example

import android.os.Bundle
import android.widget.Button
import android.widget.EditText
import android.widget.TextView
import androidx.appcompat.app.AppCompatActivity
import androidx.lifecycle.lifecycleScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import org.json.JSONObject
import java.io.File
import mobile.Engine
import mobile.Mobile
import mobile.TokenCallback

// MainActivity loads a model (assets/model.gguf copied to the app's
// private files, or the embedded default when there is none), then
// streams a generation into a TextView. Everything that blocks (loading,
// Generate, Close) runs on background dispatchers; the callbacks post
// their text to the UI thread.
class MainActivity : AppCompatActivity() {
    private var engine: Engine? = null
    private var job: Job? = null
    private var requests = 0

    private lateinit var prompt: EditText
    private lateinit var output: TextView
    private lateinit var status: TextView
    private lateinit var generate: Button
    private lateinit var cancel: Button

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        prompt = findViewById(R.id.prompt)
        output = findViewById(R.id.output)
        status = findViewById(R.id.status)
        generate = findViewById(R.id.generate)
        cancel = findViewById(R.id.cancel)

        lifecycleScope.launch {
            try {
                engine = withContext(Dispatchers.IO) { Mobile.newEngine(engineConfig()) }
                output.text = ""
                generate.isEnabled = true
            } catch (e: Exception) {
                output.text = "Loading failed: ${e.message}"
            }
        }
        generate.setOnClickListener { startGeneration() }
        // Cancel never blocks: the running generate returns with finish "cancelled".
        cancel.setOnClickListener { engine?.cancel(currentId()) }
    }

    // engineConfig copies assets/model.gguf to the app's private files
    // (the engine maps a file by path) and names it; without one the
    // engine runs its embedded default model. budget "auto" streams the
    // weights when they would take more than half the available memory.
    private fun engineConfig(): String {
        val config = JSONObject().put("budget", "auto").put("threads", 4)
        if (assets.list("")?.contains(MODEL_ASSET) == true) {
            val file = File(filesDir, MODEL_ASSET)
            if (!file.exists()) {
                val partial = File(filesDir, "$MODEL_ASSET.part")
                assets.open(MODEL_ASSET).use { input -> partial.outputStream().use { input.copyTo(it) } }
                partial.renameTo(file)
            }
            config.put("model", file.absolutePath)
        }
        return config.toString()
    }

    private fun currentId() = "story-$requests"

    private fun startGeneration() {
        val e = engine ?: return
        requests++
        val request = JSONObject()
            .put("id", currentId())
            .put("prompt", prompt.text.toString())
            .put("max_tokens", 200)
            .put("temperature", 0.8)
            .toString()
        output.text = ""
        generate.isEnabled = false
        cancel.isEnabled = true
        val callback = object : TokenCallback {
            override fun onToken(text: String) {
                runOnUiThread { output.append(text) }
            }

            override fun onSegment(text: String) {}
        }
        job = lifecycleScope.launch {
            val summary = try {
                // generate blocks until the request ends: off the UI thread.
                val result = JSONObject(withContext(Dispatchers.Default) { e.generate(request, callback) })
                "${result.getString("finish")}: ${result.getInt("completion_tokens")} tokens in ${result.getDouble("total_ms")} ms"
            } catch (ex: Exception) {
                "Error: ${ex.message}"
            }
            status.text = summary
            generate.isEnabled = true
            cancel.isEnabled = false
        }
    }

    override fun onDestroy() {
        super.onDestroy()
        val e = engine ?: return
        engine = null
        // close cancels what runs and waits for the lanes to stop.
        Thread { e.close() }.start()
    }

    companion object {
        const val MODEL_ASSET = "model.gguf"
    }
}
